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
    assert_eq!((s.min_polling_interval.as_millis(), s.max_polling_interval.as_secs()), (800, 60));
    assert_eq!(queue.rule, None);
    assert_eq!(queue.record_max_bytes, Some(8 << 20), "recorded by default, within 8 MiB");
    let off = Config::parse(&text.replace("handler", "record = false\nhandler"), Path::new("/srv/ebb"), None).unwrap();
    assert_eq!(off.queues[0].record_max_bytes, None);
}

#[test]
fn the_token_can_come_from_the_environment() {
    let text = "[api]\nlisten = \"0.0.0.0:7070\"\n[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n";
    let config = Config::parse(text, Path::new("/srv"), Some("s3cret".into())).unwrap();
    assert_eq!(config.default_token(), Some("s3cret"));
    assert_eq!(config.tokens.iter().map(|t| (t.name.as_str(), t.role)).collect::<Vec<_>>(), [("default", ebb::config::ApiRole::Admin)]);
}

#[test]
fn a_data_dir_or_rules_dir_that_is_a_file_is_rejected_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a-file"), "not a folder").unwrap();
    let queue = "[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n";
    for (key, value, expected) in [
        ("data_dir", "a-file", "data_dir: {dir}/a-file is a file, not a folder"),
        ("rules_dir", "a-file", "rules_dir: {dir}/a-file is a file, not a folder"),
        ("data_dir", "a-file/data", "data_dir: {dir}/a-file/data cannot be a folder: {dir}/a-file is a file"),
    ] {
        let config = dir.path().join("ebb.toml");
        std::fs::write(&config, format!("{key} = \"{value}\"\n{queue}")).unwrap();
        let error = format!("{:#}", Config::load(&config).unwrap_err());
        let expected = expected.replace("{dir}", &dir.path().display().to_string());
        assert!(error.ends_with(&expected), "{key} = {value:?}: {error}");
    }
    // Folders that exist, or do not exist yet, are fine.
    std::fs::create_dir(dir.path().join("rules")).unwrap();
    std::fs::write(dir.path().join("ebb.toml"), format!("data_dir = \"new/data\"\n{queue}")).unwrap();
    Config::load(&dir.path().join("ebb.toml")).unwrap();
}

#[test]
fn bounds_are_inclusive_at_their_limits() {
    let text = "max_message_bytes = 1048576\ndrain_timeout = \"1h\"\n[rule_limits]\ncall_deadline = \"1s\"\nmemory_mib = 4096\n\
                [queues.orders]\nlease_duration = \"7days\"\nvisibility_timeout = \"7days\"\nmax_retry_delay = \"7days\"\n\
                max_polling_interval = \"1h\"\nscale_interval = \"1h\"\nmax_claim_check_bytes = 4294967296\nclaim_check_retention = \"1year\"\n\
                claim_sweep_interval = \"24h\"\nhandler = { url = \"https://app.example:8443/work\", timeout = \"1h\" }\n";
    let config = Config::parse(text, Path::new("/srv/ebb"), None).unwrap();
    assert_eq!(config.max_message_bytes, 1 << 20);
    assert_eq!(config.api_limits.max_body_bytes, 1 << 20, "the API's body limit is the largest message");
    assert_eq!(config.queues[0].settings.lease_duration, ebb::queue::MAX_VISIBILITY);
    assert_eq!(config.queues[0].claims.max_bytes, 4 << 30);
}

/// The documented value of every key (`docs/reference/config.md`, the tables' default column) is the
/// code's: defaults are written once in the code, and the docs must follow.
#[test]
fn the_documented_defaults_are_the_code_defaults() {
    use std::time::Duration;

    use ebb::config::{OtlpProtocol, TelemetryFile};

    #[derive(Debug)]
    enum Code {
        Duration(Duration),
        Number(u64),
        Text(String),
        Bool(bool),
        Float(f64),
        Absent,
    }
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/config.md")).unwrap();
    let config = Config::parse("[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n", Path::new("/srv/ebb"), None).unwrap();
    let with_bus = Config::parse(
        "[bus]\nredis_url = \"redis://127.0.0.1:6379/\"\n[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n",
        Path::new("/srv/ebb"),
        None,
    )
    .unwrap();
    let queue = &config.queues[0];
    let (s, limits, api) = (&queue.settings, &config.rule_limits, &config.api_limits);
    // The scaler is off by default; its other keys' defaults, once it is on.
    let scaler_on = "[scaler]\nlisten = \"127.0.0.1:7071\"\n[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n";
    let scaler = Config::parse(scaler_on, Path::new("/srv/ebb"), None).unwrap().scaler.unwrap();
    // The export's defaults, once an endpoint is given.
    let telemetry = TelemetryFile { otlp_endpoint: Some("http://collector:4318".into()), ..TelemetryFile::default() };
    let exported = telemetry.resolve(|_| None).unwrap().unwrap();
    let code = |section: &str, key: &str| -> Code {
        match (section, key) {
            ("Top level", "data_dir") => Code::Text(config.data_dir.strip_prefix("/srv/ebb").unwrap().display().to_string()),
            ("Top level", "rules_dir") => Code::Text(config.rules_dir.strip_prefix("/srv/ebb").unwrap().display().to_string()),
            ("Top level", "max_message_bytes") => Code::Number(config.max_message_bytes as u64),
            ("Top level", "drain_timeout") => Code::Duration(config.drain_timeout),
            ("Top level", "price_per_10k_transactions") => Code::Float(config.price_per_10k_transactions),
            ("`[api]`", "listen") => Code::Text(config.listen.to_string()),
            ("`[api]`", "token") => config.default_token().map_or(Code::Absent, |t| Code::Text(t.into())),
            ("`[[api.tokens]]`", "name" | "role") => Code::Absent,       // required
            ("`[[api.tokens]]`", "token" | "token_env") => Code::Absent, // one of the two is required
            ("`[api]`", "header_read_timeout") => Code::Duration(api.header_read_timeout),
            ("`[api]`", "idle_timeout") => Code::Duration(api.idle_timeout),
            ("`[api]`", "body_read_timeout") => Code::Duration(api.body_read_timeout),
            ("`[api]`", "max_connections") => Code::Number(api.max_connections as u64),
            ("`[api]`", "probe_connections") => Code::Number(api.probe_connections as u64),
            ("`[scaler]`", "listen") => config.scaler.as_ref().map_or(Code::Absent, |s| Code::Text(s.listen.to_string())),
            ("`[scaler]`", "token") => scaler.token.clone().map_or(Code::Absent, Code::Text),
            ("`[scaler]`", "max_instances") => Code::Number(scaler.max_instances.into()),
            ("`[scaler]`", "poll_interval") => Code::Duration(scaler.poll_interval),
            ("`[log]`", "format") => Code::Text(config.log_format.to_string()),
            ("`[telemetry]`", "otlp_endpoint") => Code::Absent,
            ("`[telemetry]`", "protocol") => Code::Text(
                match exported.protocol {
                    OtlpProtocol::HttpProtobuf => "http/protobuf",
                    OtlpProtocol::Grpc => "grpc",
                }
                .into(),
            ),
            ("`[telemetry]`", "service_name") => Code::Text(exported.service_name.clone()),
            ("`[rule_limits]`", "call_deadline") => Code::Duration(limits.call_deadline),
            ("`[rule_limits]`", "call_fuel") => Code::Number(limits.call_fuel),
            ("`[rule_limits]`", "memory_mib") => Code::Number((limits.memory_bytes >> 20) as u64),
            ("`[rule_limits]`", "quarantine_after") => Code::Number(limits.quarantine_after.into()),
            ("`[rule_limits]`", "cache_mib") => Code::Number(limits.cache_max_bytes >> 20),
            ("`[azure]`", "message_encoding") => Code::Text("base64".into()),
            ("`[azure]`", _) => Code::Absent,
            ("`[aws]`", "message_encoding") => Code::Text("auto".into()),
            ("`[aws]`", _) => Code::Absent,
            ("`[bus]`", "channel_prefix") => Code::Text(with_bus.bus.as_ref().unwrap().channel_prefix.clone()),
            ("`[bus]`", _) => Code::Absent,
            ("`[queues.<name>]`", key) => match key {
                "batch_size" => Code::Number(s.batch_size.into()),
                "min_tasks" => Code::Number(s.min_tasks.into()),
                "max_tasks" => Code::Number(s.max_tasks.into()),
                "max_concurrent_calls" => Code::Number(s.max_concurrent_calls.into()),
                "min_polling_interval" => Code::Duration(s.min_polling_interval),
                "max_polling_interval" => Code::Duration(s.max_polling_interval),
                "visibility_timeout" => Code::Duration(s.visibility_timeout),
                "max_retry_delay" => Code::Duration(s.max_retry_delay),
                "lease_duration" => Code::Duration(s.lease_duration),
                "max_dequeue_count" => Code::Number(s.max_dequeue_count.into()),
                "push" => Code::Bool(s.push_enabled),
                "safety_poll" => Code::Duration(s.safety_poll),
                "scale_interval" => Code::Duration(s.scale_interval),
                "max_pickup_delay" => Code::Duration(s.max_pickup_delay),
                "partitions" => Code::Number(queue.partitions.into()),
                "max_claim_check_bytes" => Code::Number(queue.claims.max_bytes),
                "claim_check_retention" => Code::Duration(queue.claims.retention),
                "claim_sweep_interval" => Code::Duration(queue.claims.sweep_interval),
                "record" => Code::Bool(queue.record_max_bytes.is_some()),
                "record_max_bytes" => Code::Number(queue.record_max_bytes.unwrap_or(0)),
                "backend" => Code::Text(if matches!(queue.backend, ebb::config::Backend::Embedded) { "embedded" } else { "azure" }.into()),
                "rule" => queue.rule.as_ref().map_or(Code::Absent, |file| Code::Text(file.to_string())),
                "rule_params" if queue.rule_params.is_empty() => Code::Absent,
                "compression" => Code::Text(queue.payload.compression.to_string()),
                "pack_linger" => Code::Duration(queue.payload.pack_linger),
                "delivery" => Code::Text(format!("{:?}", queue.payload.delivery).to_lowercase()),
                "max_batch_items" => Code::Number(queue.payload.max_batch_items.into()),
                "reply_queue" => queue.payload.reply_queue.clone().map_or(Code::Absent, Code::Text),
                "reply_ttl" => Code::Duration(queue.payload.reply_ttl),
                "trace_envelope" => Code::Bool(queue.payload.trace_envelope),
                "shadow_rule" => queue.shadow_rule.as_ref().map_or(Code::Absent, |file| Code::Text(file.to_string())),
                "shadow_rule_params" if queue.shadow_rule_params.is_empty() => Code::Absent,
                "handler.url" => Code::Absent, // required
                "handler.timeout" => Code::Duration(queue.handler_timeout),
                _ => panic!("docs/reference/config.md documents queues.{key}: add it to this test"),
            },
            _ => panic!("docs/reference/config.md documents {key} under {section}: add it to this test"),
        }
    };
    let mut section = String::new();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for line in docs.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            section = title.trim().to_string();
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 || !cells[1].starts_with('`') {
            continue;
        }
        let key = cells[1].trim_matches('`');
        let documented = cells[3].trim_matches('`').trim_matches('"');
        let matches = match code(&section, key) {
            Code::Duration(d) => humantime::parse_duration(documented).ok() == Some(d),
            Code::Number(n) => documented.parse::<u64>().ok() == Some(n),
            Code::Text(t) => documented == t,
            Code::Bool(b) => documented.parse::<bool>().ok() == Some(b),
            Code::Float(f) => documented.parse::<f64>().ok() == Some(f),
            Code::Absent => ["none", "built-in", "required"].contains(&documented) || documented.starts_with("required by"),
        };
        if !matches {
            wrong.push(format!("{section} {key}: documented {documented:?}, code has {:?}", code(&section, key)));
        }
        checked += 1;
    }
    assert!(checked >= 28, "found only {checked} documented keys");
    assert!(wrong.is_empty(), "docs/reference/config.md disagrees with the code:\n{}", wrong.join("\n"));
    // The queue name length, too.
    let max = ebb::config::MAX_QUEUE_NAME_LEN;
    assert!(docs.contains(&format!("3 to {max} lowercase letters")), "docs/reference/config.md states another queue name length than {max}");
    let name = |len: usize| format!("[queues.{}]\nhandler = {{ url = \"http://127.0.0.1:8080/work\" }}\n", "q".repeat(len));
    assert!(Config::parse(&name(max), Path::new("/srv"), None).is_ok());
    assert!(Config::parse(&name(max + 1), Path::new("/srv"), None).is_err());
}

/// Replies that lead on to a queue without a `reply_queue` end there: only a cycle is refused.
#[test]
fn a_chain_of_reply_queues_without_a_cycle_is_accepted() {
    let text = "[queues.orders]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\nreply_queue = \"invoices\"\n\
                [queues.invoices]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\nreply_queue = \"audit\"\n\
                [queues.audit]\nhandler = { url = \"http://127.0.0.1:8080/work\" }\n";
    let config = Config::parse(text, Path::new("/srv/ebb"), None).unwrap();
    let replies: Vec<_> = config.queues.iter().map(|q| (q.name.as_str(), q.payload.reply_queue.as_deref())).collect();
    assert_eq!(replies, [("audit", None), ("invoices", Some("audit")), ("orders", Some("invoices"))]);
}

/// Issue 37: an SQS queue needs no `[aws]` (the SDK's environment decides), a queue's
/// `[queues.<name>.sqs]` goes over `[aws]` key by key, static keys come from the variables
/// named, and they never show in the config's debug form.
#[test]
fn an_sqs_queue_takes_aws_settings_from_its_table_over_aws_and_hides_its_keys() {
    use ebb::config::Backend;
    let handler = "handler = { url = \"http://127.0.0.1:8080/work\" }";
    let bare = Config::parse(&format!("[queues.orders]\nbackend = \"sqs\"\n{handler}\n"), Path::new("/srv"), None).unwrap();
    let Backend::Sqs { account, queue_url, .. } = &bare.queues[0].backend else { panic!("{:?}", bare.queues[0].backend) };
    assert_eq!((account.settings().region.as_deref(), account.settings().endpoint.as_deref(), queue_url), (None, None, &None));
    assert_eq!(bare.queues[0].settings.batch_size, 10, "an SQS receive takes at most 10");

    // SAFETY: the variables are this test's own, read only by this test's parse.
    unsafe {
        std::env::set_var("EBB_TEST_CONFIG_SQS_KEY_ID", "AKIDCONFIGTEST");
        std::env::set_var("EBB_TEST_CONFIG_SQS_SECRET", "config-test-secret");
    }
    let text = format!(
        "[aws]\nregion = \"eu-west-1\"\nendpoint = \"http://127.0.0.1:5000\"\naccess_key_id_env = \"EBB_TEST_CONFIG_SQS_KEY_ID\"\nsecret_access_key_env = \"EBB_TEST_CONFIG_SQS_SECRET\"\n\n\
         [queues.orders]\nbackend = \"sqs\"\nbatch_size = 4\n{handler}\n\n[queues.orders.sqs]\nregion = \"us-east-2\"\nmessage_encoding = \"text\"\nqueue_url = \"http://127.0.0.1:5000/123456789012/other\"\n"
    );
    let config = Config::parse(&text, Path::new("/srv"), None).unwrap();
    let Backend::Sqs { account, encoding, queue_url, .. } = &config.queues[0].backend else { panic!() };
    let settings = account.settings();
    assert_eq!((settings.region.as_deref(), settings.endpoint.as_deref()), (Some("us-east-2"), Some("http://127.0.0.1:5000")));
    assert!(matches!(&settings.credentials, ebb::queue::sqs::AwsCredentials::Static { access_key_id, .. } if access_key_id == "AKIDCONFIGTEST"));
    assert_eq!((*encoding, queue_url.clone()), (ebb::queue::sqs::Encoding::Text, Some(("orders".into(), "http://127.0.0.1:5000/123456789012/other".into()))));
    assert_eq!(config.queues[0].settings.batch_size, 4);
    let printed = format!("{config:?}");
    assert!(!printed.contains("AKIDCONFIGTEST") && !printed.contains("config-test-secret"), "{printed}");
}
