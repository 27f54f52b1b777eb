//! `--config FILE`: the options of `mount`, `replicate`, `bootstrap` and
//! `check` kept in a TOML file (issue 32).
//!
//! The file's keys are the commands' long flags without the dashes
//! (`state`, `source-map`, `hive-metastore`, ...) and the positional
//! `mountpoint`; values are strings, integers, booleans (for switches such
//! as `allow-other`) or arrays of strings (for repeatable flags such as
//! `source-map`). The file is not a second parser: [`apply`] turns each key
//! into the command-line flag it names and inserts it ahead of the flags
//! given, so clap checks file values exactly as it checks flags, every
//! option is a config key with no code here, and a future flag (a publish
//! URL, an S3 setting) is one more key the day it exists.
//!
//! Rules:
//! - A flag on the command line overrides the file's key (a repeatable
//!   flag given on the command line replaces the file's whole list).
//! - A key no command knows is an error naming the key and its line; a key
//!   that another of the four commands knows (`allow-other` read by
//!   `replicate`) is skipped, so one file serves `mount` and `check`, or
//!   `replicate` and `bootstrap`.
//! - Secrets are never values: the metastore password comes from
//!   `metastore-password-file` (a file) or `STAGEFS_METASTORE_PASSWORD`.
//!
//! Called by the binary before the real parse.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, Command};
use toml::Spanned;

/// The commands whose options a config file holds.
pub const CONFIG_COMMANDS: &[&str] = &["mount", "replicate", "bootstrap", "check"];

/// The flag that names the file; itself no key.
pub const CONFIG_FLAG: &str = "config";

/// Why a config file was refused. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--config {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("--config {}: not valid TOML: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("--config {}, line {line}: unknown key `{key}` (keys are the long flags of `stagefs {}`, e.g. `state`, `source-map`)", path.display(), CONFIG_COMMANDS.join("`, `stagefs "))]
    UnknownKey {
        path: PathBuf,
        key: String,
        line: usize,
    },
    #[error("--config {}, line {line}: `{key}` {why}", path.display())]
    BadValue {
        path: PathBuf,
        key: String,
        line: usize,
        why: String,
    },
}

/// Returns `argv` with the options of the `--config` file it names (if
/// any) inserted after the subcommand, leaving out those the command line
/// gives itself. `cli` is the whole command-line definition. An `argv`
/// clap cannot make sense of is returned unchanged for clap to report.
pub fn apply(cli: &Command, argv: Vec<OsString>) -> Result<Vec<OsString>, ConfigError> {
    // A first, tolerant parse: which subcommand, which file, which options
    // the command line gives (required ones may be in the file).
    let Ok(matches) = cli.clone().ignore_errors(true).try_get_matches_from(&argv) else {
        return Ok(argv);
    };
    let Some((name, sub_matches)) = matches.subcommand() else {
        return Ok(argv);
    };
    if !CONFIG_COMMANDS.contains(&name) {
        return Ok(argv);
    }
    let Some(path) = sub_matches
        .try_get_one::<PathBuf>(CONFIG_FLAG)
        .ok()
        .flatten()
        .cloned()
    else {
        return Ok(argv);
    };
    let Some(sub) = cli.find_subcommand(name) else {
        return Ok(argv);
    };
    // (Global options are propagated into the subcommand's matches.)
    let given = |id: &str| {
        sub_matches.ids().any(|i| i.as_str() == id)
            && sub_matches.value_source(id) == Some(ValueSource::CommandLine)
    };
    let options = file_options(cli, sub, &path, &given)?;
    // After the first token that is the subcommand (flags before it are
    // global ones, whose values are never a subcommand's name).
    let at = argv
        .iter()
        .skip(1)
        .position(|a| a == name)
        .map_or(argv.len(), |i| i + 2);
    let mut out = argv;
    out.splice(at..at, options);
    Ok(out)
}

/// The flags the file at `path` stands for, for subcommand `sub` of `cli`,
/// leaving out the options `given` on the command line.
fn file_options(
    cli: &Command,
    sub: &Command,
    path: &Path,
    given: &dyn Fn(&str) -> bool,
) -> Result<Vec<OsString>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_owned(),
        error,
    })?;
    let table: std::collections::BTreeMap<Spanned<String>, toml::Value> = toml::from_str(&text)
        .map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            message: e.message().to_owned(),
        })?;
    let known = known_keys(cli);
    let mut flags = Vec::new();
    let mut positionals = Vec::new();
    for (key, value) in &table {
        let line = text[..key.span().start].matches('\n').count() + 1;
        let key = key.get_ref();
        let bad = |why: String| ConfigError::BadValue {
            path: path.to_owned(),
            key: key.clone(),
            line,
            why,
        };
        if !known.contains(key.as_str()) {
            return Err(ConfigError::UnknownKey {
                path: path.to_owned(),
                key: key.clone(),
                line,
            });
        }
        // The subcommand's own options and the global ones.
        let arg = sub
            .get_arguments()
            .chain(cli.get_arguments())
            .find(|a| key_of(a).as_deref() == Some(key.as_str()));
        let Some(arg) = arg else {
            continue; // Another command's key.
        };
        if given(arg.get_id().as_str()) {
            continue;
        }
        let switch = matches!(arg.get_action(), ArgAction::SetTrue);
        let repeatable = matches!(arg.get_action(), ArgAction::Append);
        let values: Vec<String> = match value {
            toml::Value::Boolean(on) if switch => {
                if *on {
                    flags.push(OsString::from(format!("--{key}")));
                }
                continue;
            }
            _ if switch => return Err(bad("is a switch: write true or false".into())),
            toml::Value::String(s) => vec![s.clone()],
            toml::Value::Integer(n) => vec![n.to_string()],
            toml::Value::Float(f) => vec![f.to_string()],
            toml::Value::Array(items) if repeatable => items
                .iter()
                .map(|item| match item {
                    toml::Value::String(s) => Ok(s.clone()),
                    toml::Value::Integer(n) => Ok(n.to_string()),
                    _ => Err(bad("takes a list of strings".into())),
                })
                .collect::<Result<_, _>>()?,
            toml::Value::Array(_) => return Err(bad("takes one value, not a list".into())),
            toml::Value::Boolean(_) => return Err(bad("takes a value, not true or false".into())),
            toml::Value::Table(_) => {
                return Err(bad("is a table; the file holds top-level keys only".into()))
            }
            toml::Value::Datetime(_) => return Err(bad("takes a string, not a date".into())),
        };
        for v in values {
            if arg.is_positional() {
                positionals.push(OsString::from(v));
            } else {
                // `--key=value`: a value that starts with `-` stays a value.
                flags.push(OsString::from(format!("--{key}={v}")));
            }
        }
    }
    flags.extend(positionals);
    Ok(flags)
}

/// `url` with `password_file=FILE` added to its query (after any already
/// there, so this one is read): how `metastore-password-file` reaches the
/// metastore connection.
pub fn with_password_file(url: &str, file: &Path) -> String {
    let mut encoded = String::new();
    for b in file.as_os_str().as_encoded_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                encoded.push(*b as char)
            }
            _ => encoded.push_str(&format!("%{b:02X}")),
        }
    }
    let join = if url.contains('?') { '&' } else { '?' };
    format!("{url}{join}password_file={encoded}")
}

/// The key of an argument: its long flag, or the id of a positional.
fn key_of(arg: &clap::Arg) -> Option<String> {
    if arg.is_positional() {
        return Some(arg.get_id().as_str().to_owned());
    }
    arg.get_long().map(str::to_owned)
}

/// Every key some config command (or the command line as a whole) knows.
pub fn known_keys(cli: &Command) -> BTreeSet<String> {
    let mut keys: BTreeSet<String> = cli.get_arguments().filter_map(key_of).collect();
    for name in CONFIG_COMMANDS {
        if let Some(sub) = cli.find_subcommand(name) {
            keys.extend(sub.get_arguments().filter_map(key_of));
        }
    }
    for builtin in ["help", "version", CONFIG_FLAG] {
        keys.remove(builtin);
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn cli() -> Command {
        Command::new("t")
            .arg(Arg::new("log-format").long("log-format").global(true))
            .subcommand(
                Command::new("mount")
                    .arg(Arg::new("mountpoint").required(true))
                    .arg(Arg::new("state").long("state").required(true))
                    .arg(
                        Arg::new("source-map")
                            .long("source-map")
                            .action(ArgAction::Append),
                    )
                    .arg(
                        Arg::new("allow-other")
                            .long("allow-other")
                            .action(ArgAction::SetTrue),
                    )
                    .arg(
                        Arg::new("retain")
                            .long("retain")
                            .value_parser(clap::value_parser!(u64))
                            .default_value("16"),
                    )
                    .arg(
                        Arg::new(CONFIG_FLAG)
                            .long(CONFIG_FLAG)
                            .value_parser(clap::value_parser!(PathBuf)),
                    ),
            )
            .subcommand(
                Command::new("replicate")
                    .arg(Arg::new("state").long("state").required(true))
                    .arg(
                        Arg::new(CONFIG_FLAG)
                            .long(CONFIG_FLAG)
                            .value_parser(clap::value_parser!(PathBuf)),
                    ),
            )
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    fn argv(items: &[&str]) -> Vec<OsString> {
        items.iter().map(OsString::from).collect()
    }

    fn parse(argv: Vec<OsString>) -> clap::ArgMatches {
        let merged = apply(&cli(), argv).unwrap();
        cli().try_get_matches_from(merged).unwrap()
    }

    #[test]
    fn file_values_fill_what_the_command_line_leaves_out() {
        let f = file(
            "mountpoint = \"/mnt/w\"\nstate = \"/s\"\nsource-map = [\"a=/x\", \"b=/y\"]\nallow-other = true\nretain = 3\nlog-format = \"json\"\n",
        );
        let m = parse(argv(&[
            "t",
            "mount",
            "--config",
            f.path().to_str().unwrap(),
        ]));
        let (_, m) = m.subcommand().unwrap();
        assert_eq!(m.get_one::<String>("mountpoint").unwrap(), "/mnt/w");
        assert_eq!(m.get_one::<String>("state").unwrap(), "/s");
        let maps: Vec<&String> = m.get_many("source-map").unwrap().collect();
        assert_eq!(maps, ["a=/x", "b=/y"]);
        assert!(m.get_flag("allow-other"));
        assert_eq!(*m.get_one::<u64>("retain").unwrap(), 3);
        assert_eq!(m.get_one::<String>("log-format").unwrap(), "json");
    }

    #[test]
    fn flags_override_the_file_and_lists_are_replaced_whole() {
        let f =
            file("mountpoint = \"/mnt/w\"\nstate = \"/s\"\nsource-map = [\"a=/x\"]\nretain = 3\n");
        let m = parse(argv(&[
            "t",
            "mount",
            "/mnt/cli",
            "--state=/cli",
            "--config",
            f.path().to_str().unwrap(),
            "--source-map",
            "c=/z",
        ]));
        let (_, m) = m.subcommand().unwrap();
        assert_eq!(m.get_one::<String>("mountpoint").unwrap(), "/mnt/cli");
        assert_eq!(m.get_one::<String>("state").unwrap(), "/cli");
        let maps: Vec<&String> = m.get_many("source-map").unwrap().collect();
        assert_eq!(maps, ["c=/z"]);
        assert_eq!(*m.get_one::<u64>("retain").unwrap(), 3);
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let f = file("state = \"/s\"\n# a comment\nsource_map = [\"a=/x\"]\n");
        let err = apply(
            &cli(),
            argv(&["t", "mount", "--config", f.path().to_str().unwrap()]),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, ConfigError::UnknownKey { line: 3, .. }),
            "{text}"
        );
        assert!(
            text.contains("`source_map`") && text.contains("line 3"),
            "{text}"
        );
    }

    #[test]
    fn another_commands_key_is_skipped() {
        let f = file("mountpoint = \"/mnt/w\"\nstate = \"/s\"\nallow-other = true\n");
        let m = parse(argv(&[
            "t",
            "replicate",
            "--config",
            f.path().to_str().unwrap(),
        ]));
        let (_, m) = m.subcommand().unwrap();
        assert_eq!(m.get_one::<String>("state").unwrap(), "/s");
    }

    #[test]
    fn wrong_value_types_are_errors_naming_the_key() {
        for (text, key) in [
            ("allow-other = \"yes\"\n", "allow-other"),
            ("state = [\"/a\", \"/b\"]\n", "state"),
            ("state = true\n", "state"),
            ("[state]\nx = 1\n", "state"),
        ] {
            let f = file(text);
            let err = apply(
                &cli(),
                argv(&["t", "mount", "--config", f.path().to_str().unwrap()]),
            )
            .unwrap_err();
            assert!(
                matches!(&err, ConfigError::BadValue { key: k, line: 1, .. } if k == key),
                "{text:?}: {err}"
            );
        }
    }

    /// Every option of every config command, once as a file key and once
    /// as a flag, parses to the same values (with the real command line,
    /// so a new flag is covered the day it is added).
    #[test]
    fn every_option_round_trips_through_the_file() {
        use clap::CommandFactory;
        let real = crate::cli::Cli::command();
        for name in CONFIG_COMMANDS {
            let sub = real.find_subcommand(name).unwrap();
            let mut toml_text = String::new();
            let mut flags = vec![OsString::from("stagefs"), OsString::from(*name)];
            let mut positional = Vec::new();
            let mut keys = 0;
            for arg in sub.get_arguments() {
                let Some(key) = key_of(arg) else { continue };
                if ["help", "version", CONFIG_FLAG].contains(&key.as_str()) {
                    continue;
                }
                keys += 1;
                // A value each option takes (most take a number).
                let value = match key.as_str() {
                    "log-format" => "json",
                    "event-time-margin" => "3s",
                    _ => "7",
                };
                match arg.get_action() {
                    ArgAction::SetTrue => {
                        toml_text.push_str(&format!("{key} = true\n"));
                        flags.push(format!("--{key}").into());
                    }
                    ArgAction::Append => {
                        toml_text.push_str(&format!("{key} = [\"a=/x\", \"b=/y\"]\n"));
                        for v in ["a=/x", "b=/y"] {
                            flags.push(format!("--{key}").into());
                            flags.push(v.into());
                        }
                    }
                    _ if arg.is_positional() => {
                        toml_text.push_str(&format!("{key} = \"/p\"\n"));
                        positional.push(OsString::from("/p"));
                    }
                    _ => {
                        toml_text.push_str(&format!("{key} = \"{value}\"\n"));
                        flags.push(format!("--{key}").into());
                        flags.push(value.into());
                    }
                }
            }
            assert!(keys >= 10, "{name}: only {keys} options?");
            flags.extend(positional);
            let f = file(&toml_text);
            let from_file = apply(
                &real,
                argv(&["stagefs", name, "--config", f.path().to_str().unwrap()]),
            )
            .unwrap();
            // Some options exclude each other (native and Hive sources):
            // compare what was parsed, not whether the set is usable.
            let parse = |argv: Vec<OsString>| {
                real.clone()
                    .ignore_errors(true)
                    .try_get_matches_from(argv)
                    .unwrap()
            };
            let (a, b) = (parse(from_file), parse(flags));
            let (a, b) = (
                a.subcommand_matches(name).unwrap(),
                b.subcommand_matches(name).unwrap(),
            );
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if id == CONFIG_FLAG {
                    continue;
                }
                let raw = |m: &clap::ArgMatches| {
                    m.get_raw(id)
                        .map(|v| v.map(|s| s.to_owned()).collect::<Vec<_>>())
                };
                assert_eq!(raw(a), raw(b), "{name}: option {id}\n{toml_text}");
            }
        }
    }

    /// docs/stagefs.example.toml is a complete, valid `mount`,
    /// `bootstrap` and `check` configuration.
    #[test]
    fn the_example_config_parses() {
        use clap::{CommandFactory, FromArgMatches};
        let real = crate::cli::Cli::command();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/stagefs.example.toml");
        for name in ["mount", "bootstrap", "check"] {
            let merged = apply(
                &real,
                argv(&["stagefs", name, "--config", path.to_str().unwrap()]),
            )
            .unwrap();
            let m = real.clone().try_get_matches_from(merged).unwrap();
            let cli = crate::cli::Cli::from_arg_matches(&m).unwrap();
            assert_eq!(cli.log_format, crate::daemon::LogFormat::Text);
            match cli.command {
                crate::cli::Command::Mount {
                    mountpoint,
                    source,
                    allow_other,
                    ..
                } => {
                    assert_eq!(mountpoint, Path::new("/mnt/warehouse"));
                    assert!(allow_other);
                    let source = source.expect("the source flags");
                    assert_eq!(source.source_map.len(), 2);
                    assert_eq!(source.retain, 16);
                    assert_eq!(
                        source.s3_endpoint.as_deref(),
                        Some("http://minio.internal:9000")
                    );
                }
                crate::cli::Command::Bootstrap { source } => {
                    assert_eq!(source.state, Path::new("/var/lib/stagefs"));
                    assert!(source.bootstrap);
                    // The URL's TLS options are ones the metastore accepts.
                    let url = source.hive_metastore.unwrap();
                    crate::source::hive::metastore::Endpoint::parse(&url, None)
                        .unwrap_or_else(|e| panic!("{url}: {e}"));
                }
                crate::cli::Command::Check {
                    mountpoint,
                    allow_other,
                    metrics,
                    ..
                } => {
                    assert_eq!(mountpoint.as_deref(), Some(Path::new("/mnt/warehouse")));
                    assert!(allow_other);
                    assert_eq!(metrics.as_deref(), Some("127.0.0.1:9464"));
                }
                other => panic!("parsed as {other:?}"),
            }
        }
    }

    #[test]
    fn a_password_file_joins_the_url_query() {
        assert_eq!(
            with_password_file("postgresql://h@db/m", Path::new("/etc/stagefs/pw file")),
            "postgresql://h@db/m?password_file=/etc/stagefs/pw%20file"
        );
        assert_eq!(
            with_password_file("mysql://h@db/m?password_file=/a", Path::new("/b")),
            "mysql://h@db/m?password_file=/a&password_file=/b"
        );
    }

    #[test]
    fn unreadable_or_malformed_files_are_errors() {
        let err = apply(
            &cli(),
            argv(&["t", "mount", "--config", "/nonexistent/stagefs.toml"]),
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
        let f = file("state = \n");
        let err = apply(
            &cli(),
            argv(&["t", "mount", "--config", f.path().to_str().unwrap()]),
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
    }
}
