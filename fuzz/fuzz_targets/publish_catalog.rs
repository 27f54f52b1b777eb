//! Arbitrary bytes as a published catalog object (one directory of a
//! state) and as a piece list: the decoders must never panic, and what
//! they accept must encode back to the same bytes (canonical, so equal
//! directories are equal objects).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stagefs::publish::catalog_object::DirObject;
use stagefs::publish::pieces::PieceList;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = DirObject::decode(data) {
        assert_eq!(d.encode(), data, "a catalog object with two spellings");
    }
    if let Ok(p) = PieceList::decode(data) {
        assert_eq!(p.encode(), data, "a piece list with two spellings");
        for i in 0..p.pieces.len() {
            let r = p.range(i);
            assert!(r.start < r.end && r.end <= p.size);
        }
    }
});
