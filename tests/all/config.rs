//! Config errors a user sees, as golden files: each `tests/config-errors/NAME.toml` beside
//! `NAME.err`, the exact text. `EBB_BLESS=1 cargo test config` rewrites the `.err` files.

use std::path::Path;

use ebb::config::Config;

#[test]
fn config_errors_name_the_key_and_the_reason() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config-errors");
    let bless = std::env::var_os("EBB_BLESS").is_some();
    let mut cases = 0;
    let mut mismatches = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        cases += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let error = match Config::parse(&text, Path::new("/srv/ebb"), None) {
            Ok(_) => panic!("{} should not be a valid config", path.display()),
            Err(error) => format!("{error:#}\n"),
        };
        let golden = path.with_extension("err");
        if bless {
            std::fs::write(&golden, &error).unwrap();
        } else if std::fs::read_to_string(&golden).ok().as_deref() != Some(error.as_str()) {
            mismatches.push(format!("{}:\n{error}", path.display()));
        }
    }
    assert!(cases >= 10, "found only {cases} cases");
    assert!(mismatches.is_empty(), "errors differ from the .err files (EBB_BLESS=1 to accept):\n{}", mismatches.join("\n"));
}

#[test]
fn a_minimal_config_gets_the_documented_defaults() {
    let text = "[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n";
    let config = Config::parse(text, Path::new("/srv/ebb"), None).unwrap();
    assert_eq!(config.data_dir, Path::new("/srv/ebb/ebb-data"));
    assert_eq!(config.rules_dir, Path::new("/srv/ebb/rules"));
    assert_eq!(config.listen.to_string(), "127.0.0.1:7070");
    let queue = &config.queues[0];
    let s = &queue.settings;
    assert_eq!((s.batch_size, s.min_tasks, s.max_tasks, s.max_dequeue_count), (32, 1, 32, 5));
    assert_eq!((s.min_polling_interval.as_millis(), s.max_polling_interval.as_secs()), (100, 60));
    assert_eq!(queue.rule.rule, None);
}

#[test]
fn the_token_can_come_from_the_environment() {
    let text = "[api]\nlisten = \"0.0.0.0:7070\"\n[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n";
    let config = Config::parse(text, Path::new("/srv"), Some("s3cret".into())).unwrap();
    assert_eq!(config.token.as_deref(), Some("s3cret"));
}
