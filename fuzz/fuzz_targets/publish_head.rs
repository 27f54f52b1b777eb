//! Arbitrary bytes as a published HEAD or `states/<id>` object (storage is
//! not trusted): `record::decode` must never panic; what it accepts must
//! encode back to the same bytes (one spelling per state), and a trusted
//! key must accept only what that key signed.
#![no_main]

use ed25519_dalek::SigningKey;
use libfuzzer_sys::fuzz_target;
use stagefs::publish::record::{decode, encode, RecordKind};

fuzz_target!(|data: &[u8]| {
    let key = SigningKey::from_bytes(&[7; 32]);
    for kind in [RecordKind::Head, RecordKind::State] {
        if let Ok(d) = decode(kind, data, None) {
            assert!(!d.signed);
            // Unsigned: re-encodes to the input exactly.
            let again = encode(kind, &d.published, None);
            if !data.windows(4).any(|w| w == b"sig ") {
                assert_eq!(again, data, "two spellings of one record");
            }
        }
        if let Ok(d) = decode(kind, data, Some(&key.verifying_key())) {
            assert!(d.signed);
            // ed25519 signatures are deterministic: only our own bytes verify.
            assert_eq!(encode(kind, &d.published, Some(&key)), data);
        }
    }
});
