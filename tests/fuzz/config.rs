//! The config file: `Config::parse_with_env` on arbitrary text, and on structured TOML whose
//! keys are real but whose values, types, tables and extra keys are hostile.

use std::path::Path;

use proptest::prelude::*;
use proptest::strategy::Union;

use crate::budget;
use ebb::config::Config;

/// What a key holds, so most values have the right type and test the checks behind the parser.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Duration,
    Integer,
    Float,
    Bool,
    Address,
    Token,
    Path,
    HandlerUrl,
    RedisUrl,
    EnvName,
    Prefix,
    Credential,
    Encoding,
    Backend,
    ConnectionString,
    Account,
    Key,
    Endpoint,
    RuleFile,
    Text,
}

const ROOT_KEYS: &[(&str, Kind)] = &[
    ("data_dir", Kind::Path),
    ("rules_dir", Kind::Path),
    ("max_message_bytes", Kind::Integer),
    ("drain_timeout", Kind::Duration),
    ("price_per_10k_transactions", Kind::Float),
];
const API_KEYS: &[(&str, Kind)] = &[
    ("listen", Kind::Address),
    ("token", Kind::Token),
    ("header_read_timeout", Kind::Duration),
    ("idle_timeout", Kind::Duration),
    ("max_connections", Kind::Integer),
];
const SCALER_KEYS: &[(&str, Kind)] = &[("listen", Kind::Address), ("token", Kind::Token), ("max_instances", Kind::Integer), ("poll_interval", Kind::Duration)];
const RULE_LIMIT_KEYS: &[(&str, Kind)] = &[
    ("call_deadline", Kind::Duration),
    ("call_fuel", Kind::Integer),
    ("memory_mib", Kind::Integer),
    ("quarantine_after", Kind::Integer),
    ("cache_mib", Kind::Integer),
];
const BUS_KEYS: &[(&str, Kind)] = &[("redis_url", Kind::RedisUrl), ("redis_url_env", Kind::EnvName), ("channel_prefix", Kind::Prefix)];
const AZURE_KEYS: &[(&str, Kind)] = &[
    ("connection_string", Kind::ConnectionString),
    ("connection_string_env", Kind::EnvName),
    ("account", Kind::Account),
    ("key", Kind::Key),
    ("key_env", Kind::EnvName),
    ("endpoint", Kind::Endpoint),
    ("credential", Kind::Credential),
    ("client_id", Kind::Text),
    ("tenant_id", Kind::Text),
    ("client_secret_env", Kind::EnvName),
    ("ca_file", Kind::Path),
    ("message_encoding", Kind::Encoding),
];
const QUEUE_KEYS: &[(&str, Kind)] = &[
    ("batch_size", Kind::Integer),
    ("min_tasks", Kind::Integer),
    ("max_tasks", Kind::Integer),
    ("min_polling_interval", Kind::Duration),
    ("max_polling_interval", Kind::Duration),
    ("visibility_timeout", Kind::Duration),
    ("max_retry_delay", Kind::Duration),
    ("lease_duration", Kind::Duration),
    ("max_dequeue_count", Kind::Integer),
    ("push", Kind::Bool),
    ("safety_poll", Kind::Duration),
    ("scale_interval", Kind::Duration),
    ("partitions", Kind::Integer),
    ("rule", Kind::RuleFile),
    ("backend", Kind::Backend),
];
const HANDLER_KEYS: &[(&str, Kind)] = &[("url", Kind::HandlerUrl), ("timeout", Kind::Duration)];
const RULE_PARAM_KEYS: &[(&str, Kind)] = &[("threshold", Kind::Text), ("", Kind::Text), ("a b", Kind::Text)];

/// The folder relative paths are taken from: one that does not exist, so nothing a file names
/// is ever found there (parsing only looks; it creates nothing).
const BASE: &str = "/nonexistent/ebb-fuzz";

/// Where an error may point: a key path of the file or one of the token variables. A TOML
/// error points with its line instead.
const ERROR_SUBJECTS: &[&str] = &[
    "data_dir:",
    "rules_dir:",
    "max_message_bytes:",
    "drain_timeout:",
    "price_per_10k_transactions:",
    "api.",
    "scaler.",
    "rule_limits.",
    "bus:",
    "bus.",
    "queues:",
    "queues.",
    "EBB_API_TOKEN:",
    "EBB_SCALER_TOKEN:",
];

/// Besides its own keys, what an error about one queue may start with: its Azure account, its
/// handler, its parameters, its name (quoted), or its storage queues clashing with another's.
const QUEUE_ERROR_SUBJECTS: &[&str] = &["azure:", "azure.", "[azure]", "handler.", "rule_params:", "\"", "its storage queue", "this name is taken"];

/// A TOML basic string holding `text` exactly.
fn toml_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn strings(options: &'static [&'static str]) -> impl Strategy<Value = String> + Clone {
    proptest::sample::select(options).prop_map(str::to_string)
}

fn quoted(text: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    text.prop_map(|t| toml_string(&t))
}

/// A duration as people (and attackers) write one.
fn duration_text() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        (0u64..100_000).prop_map(|n| n.to_string()),
        strings(&["0", "-1", "1.5", "0.001", "18446744073709551615", "18446744073709551616", "99999999999999999999999", "1e3", "", " ", "+1"]),
    ];
    let unit = strings(&[
        "ns",
        "us",
        "µs",
        "ms",
        "s",
        "sec",
        "secs",
        "m",
        "min",
        "h",
        "hr",
        "hours",
        "d",
        "days",
        "w",
        "weeks",
        "M",
        "months",
        "y",
        "years",
        "fortnight",
        "",
        " s",
        "S",
        "mS",
    ]);
    prop_oneof![
        6 => (number.clone(), unit.clone()).prop_map(|(n, u)| format!("{n}{u}")),
        1 => (number, unit.clone(), 0u64..1000, unit).prop_map(|(a, u, b, v)| format!("{a}{u} {b}{v}")),
        1 => strings(&["1h 30m", "1s1s1s", "1d 25h", "584542046090y", "1000000000000000000h", "∞", "now", "-0s", "1 s", "1s ", " 1s"]),
    ]
}

fn integer_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0i64..70_000).prop_map(|n| n.to_string()),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        2 => strings(&[
            "0", "1", "-1", "32", "33", "1024", "1025", "4096", "4097", "10000", "10001", "16384", "16385", "65536", "65537", "1048576", "1048577",
            "4294967295", "4294967296", "9223372036854775807", "-9223372036854775808", "9223372036854775808", "18446744073709551615",
            "0x7fffffffffffffff", "0o777", "0b1", "1_000", "+1", "01", "1e3", "1.0",
        ]),
    ]
}

fn float_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<f64>().prop_filter("TOML writes finite floats as digits", |f| f.is_finite()).prop_map(|f| format!("{f:?}")),
        strings(&[
            "nan",
            "+nan",
            "-nan",
            "inf",
            "+inf",
            "-inf",
            "-0.0",
            "0.0",
            "0.01",
            "100.0",
            "100.00000000000001",
            "1e308",
            "1e309",
            "5e-324",
            "1",
            "-1",
            "1."
        ]),
    ]
}

/// Any TOML value, of any type: what a wrong-typed key gets.
fn any_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        integer_text(),
        float_text(),
        strings(&["true", "false", "1979-05-27T07:32:00Z", "1979-05-27", "07:32:00", "[]", "{}", "[1, \"a\"]", "{ a = 1 }", "\"\"", "''", "'''x'''"]),
        quoted(any::<String>()),
        quoted(duration_text()),
    ];
    leaf.prop_recursive(4, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            proptest::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|v| format!("{{ {} }}", v.into_iter().map(|(k, v)| format!("{k} = {v}")).collect::<Vec<_>>().join(", "))),
        ]
    })
}

/// A value for a key of `kind`: mostly of its type and near its limits, sometimes not.
fn typed_value(kind: Kind) -> BoxedStrategy<String> {
    match kind {
        Kind::Duration => quoted(duration_text()).boxed(),
        Kind::Integer => integer_text().boxed(),
        Kind::Float => float_text().boxed(),
        Kind::Bool => strings(&["true", "false"]).boxed(),
        Kind::Address => address_value(),
        Kind::Token => token_value(),
        Kind::Path => path_value(),
        Kind::HandlerUrl => handler_url_value(),
        Kind::RedisUrl => redis_url_value(),
        Kind::EnvName => quoted(strings(&["PATH", "HOME", "EBB_FUZZ_NOT_SET", "", "A=B", "\u{0}", "ÄÖ"])).boxed(),
        Kind::Prefix => prefix_value(),
        Kind::Credential => {
            quoted(strings(&["managed-identity", "workload-identity", "azure-cli", "developer-tools", "client-secret", "ManagedIdentity", ""])).boxed()
        }
        Kind::Encoding => quoted(strings(&["base64", "none", "NONE", "utf8", ""])).boxed(),
        Kind::Backend => quoted(strings(&["embedded", "azure", "memory", "Azure", ""])).boxed(),
        Kind::ConnectionString => connection_string_value(),
        Kind::Account => quoted(strings(&["devstoreaccount1", "", "A", "ab", "has space", "ünï"])).boxed(),
        Kind::Key => quoted(strings(&["a2V5", "!!!", "", "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="])).boxed(),
        Kind::Endpoint => {
            quoted(strings(&["http://127.0.0.1:10001/devstoreaccount1", "https://a.queue.core.windows.net", "ftp://x", "x", "", "http://"])).boxed()
        }
        Kind::RuleFile => quoted(strings(&["rule.wasm", "../rule.wasm", "a/b.wasm", "a\\b.wasm", "rule.wat", "", ".wasm"])).boxed(),
        Kind::Text => prop_oneof![quoted("[ -~]{0,20}"), quoted(any::<String>())].boxed(),
    }
}

/// A listen address: good ones, near misses, and out-of-range ports.
fn address_value() -> BoxedStrategy<String> {
    quoted(strings(&[
        "127.0.0.1:7070",
        "127.0.0.1:7071",
        "127.0.0.1:0",
        "0.0.0.0:7070",
        "[::1]:7070",
        "[::]:1",
        "localhost:7070",
        "127.0.0.1",
        "127.0.0.1:65536",
        "",
        " 127.0.0.1:7070",
    ]))
    .boxed()
}

/// A token: plain, blank, with spaces or control characters, or any text.
fn token_value() -> BoxedStrategy<String> {
    prop_oneof![quoted(strings(&["t0ken", "", "  ", "tok en", "tökén", "\u{0}", "a\nb"])), quoted("[!-~]{1,64}"), quoted(any::<String>())].boxed()
}

/// A path: special files and folders, an empty or a very long one, or any text.
fn path_value() -> BoxedStrategy<String> {
    prop_oneof![
        quoted(strings(&["", ".", "..", "/", "/dev/zero", "/dev/null", "/etc/hostname", "/proc/self/mem", "rules", "ebb-data", "a\u{0}b", "~", "missing.pem"])),
        Just(toml_string(&"d".repeat(5000))),
        quoted(any::<String>()),
    ]
    .boxed()
}

/// A handler URL: mostly a good one, else a malformed one or any text.
fn handler_url_value() -> BoxedStrategy<String> {
    prop_oneof![
        4 => Just(toml_string("http://127.0.0.1:8080/work")),
        1 => quoted(strings(&[
            "http:///work", "https://x", "ftp://x", "http://", "not a url", "http://[::1]:99999", "http://a:b@host/x?y#z", "HTTP://HOST", "http://%00/",
            "",
        ])),
        1 => quoted(any::<String>()),
    ]
    .boxed()
}

/// A Redis URL: good ones and broken ones.
fn redis_url_value() -> BoxedStrategy<String> {
    quoted(strings(&[
        "redis://127.0.0.1:6379",
        "rediss://u:p@h:1/0",
        "redis://",
        "redis://:pw@[::1]:6379/99999999999",
        "unix:///tmp/x",
        "http://x",
        "",
        "redis://h:99999",
    ]))
    .boxed()
}

/// A bus channel prefix: with glob characters, too long, or any text.
fn prefix_value() -> BoxedStrategy<String> {
    prop_oneof![quoted(strings(&["ebb:queue:", "", " ", "a*", "q?", "[x", "\u{7}"])), Just(toml_string(&"p".repeat(201))), quoted(any::<String>())].boxed()
}

/// An Azure connection string: known shapes and broken ones, or random `key=value` parts.
fn connection_string_value() -> BoxedStrategy<String> {
    prop_oneof![
        quoted(strings(&[
            "UseDevelopmentStorage=true",
            "UseDevelopmentStorage=maybe",
            "UseDevelopmentStorage=true;AccountName=a",
            "AccountName=devstoreaccount1;AccountKey=a2V5;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1",
            "AccountName=a;AccountKey=!!!",
            "AccountName=;AccountKey=;",
            "AccountKey=a2V5",
            "SharedAccessSignature=sv=1&sig=x",
            "SharedAccessSignature=sv=1;QueueEndpoint=http://127.0.0.1:10001/acct",
            "SharedAccessSignature=sv=1;QueueEndpoint=not a url",
            "DefaultEndpointsProtocol=ftp;AccountName=a;AccountKey=a2V5",
            "a=b=c;;;",
            "secret-without-a-name",
            "Unknown=1",
            "",
        ])),
        quoted(
            proptest::collection::vec(("[A-Za-z]{0,12}", "[ -~]{0,16}"), 0..5)
                .prop_map(|parts| { parts.into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";") })
        ),
    ]
    .boxed()
}

/// A key of a table: one of its own (with a value of the right type, mostly), a near miss, or any.
fn entry(keys: &'static [(&'static str, Kind)]) -> impl Strategy<Value = String> {
    let known = proptest::sample::select(keys)
        .prop_flat_map(|(key, kind)| prop_oneof![15 => typed_value(kind), 1 => any_value()].prop_map(move |value| format!("{} = {value}", toml_string(key))));
    let unknown = (strings(&["batchsize", "Batch_Size", "token ", "", "api.listen", "queues", "handler", "unknown"]), any_value())
        .prop_map(|(key, value)| format!("{} = {value}", toml_string(&key)));
    prop_oneof![30 => known, 1 => unknown]
}

fn queue_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => strings(&["orders", "orders-poison", "work", "abc"]),
        1 => strings(&["ab", "Orders", "or--ders", "-x", "x-", "", "q.x", "ördérs", "0-1", "orders-0", "orders-1"]),
        1 => Just("a".repeat(57)),
        1 => "[a-z0-9-]{1,60}",
    ]
}

/// One table of the file: its header and its entries.
fn table() -> impl Strategy<Value = String> {
    let header_and_keys = prop_oneof![
        4 => Just((String::new(), ROOT_KEYS)),
        4 => Just(("[api]".to_string(), API_KEYS)),
        4 => Just(("[scaler]".to_string(), SCALER_KEYS)),
        4 => Just(("[rule_limits]".to_string(), RULE_LIMIT_KEYS)),
        4 => Just(("[bus]".to_string(), BUS_KEYS)),
        4 => Just(("[azure]".to_string(), AZURE_KEYS)),
        4 => queue_name().prop_map(|name| (format!("[queues.{}]", toml_string(&name)), QUEUE_KEYS)),
        4 => queue_name().prop_map(|name| (format!("[queues.{}.handler]", toml_string(&name)), HANDLER_KEYS)),
        4 => queue_name().prop_map(|name| (format!("[queues.{}.azure]", toml_string(&name)), AZURE_KEYS)),
        4 => queue_name().prop_map(|name| (format!("[queues.{}.rule_params]", toml_string(&name)), RULE_PARAM_KEYS)),
        1 => Just(("[nope]".to_string(), ROOT_KEYS)),
        1 => Just(("[[queues]]".to_string(), QUEUE_KEYS)),
        1 => (1usize..200).prop_map(|depth| (format!("[{}]", vec!["a"; depth].join(".")), ROOT_KEYS)),
        1 => (1usize..200).prop_map(|depth| (format!("[queues.orders.{}]", vec!["x"; depth].join(".")), HANDLER_KEYS)),
    ];
    header_and_keys
        .prop_flat_map(|(header, keys)| proptest::collection::vec(entry(keys), 0..5).prop_map(move |entries| format!("{header}\n{}\n", entries.join("\n"))))
}

/// A whole file: a root table, usually a working queue to get past "no queue", and hostile tables.
fn document() -> impl Strategy<Value = String> {
    let working_queue = proptest::option::weighted(0.7, queue_name()).prop_map(|name| match name {
        Some(name) => format!("[queues.{q}]\n[queues.{q}.handler]\nurl = \"http://127.0.0.1:8080/work\"\n", q = toml_string(&name)),
        None => String::new(),
    });
    let deep_value = (1usize..300, prop_oneof![Just(("[", "]")), Just(("{ a = ", " }"))])
        .prop_map(|(depth, (open, close))| format!("deep = {}1{}\n", open.repeat(depth), close.repeat(depth)));
    (proptest::collection::vec(entry(ROOT_KEYS), 0..4), working_queue, proptest::collection::vec(table(), 0..4), proptest::option::weighted(0.05, deep_value))
        .prop_map(|(root, queue, tables, deep)| format!("{}\n{}\n{queue}{}", root.join("\n"), deep.unwrap_or_default(), tables.concat()))
}

/// Text that is mostly TOML punctuation and key names, to reach past the first line.
fn tomlish_text() -> impl Strategy<Value = String> {
    let token = Union::new(vec![
        strings(&["[", "]", "[[", "]]", ".", "=", "\"", "'", "{", "}", ",", "\n", " ", "#", "\\", "\"\"\"", "'''"]).boxed(),
        strings(&["queues", "orders", "handler", "url", "api", "listen", "bus", "azure", "batch_size", "drain_timeout", "\"1s\"", "1", "-1", "true", "nan"])
            .boxed(),
        any::<char>().prop_map(String::from).boxed(),
    ]);
    proptest::collection::vec(token, 0..60).prop_map(|tokens| tokens.concat())
}

/// An environment token as the shell might hand it over.
fn env_token() -> impl Strategy<Value = Option<String>> {
    proptest::option::weighted(0.2, prop_oneof![strings(&["t0ken", "", " ", "tok en", "tökén"]), any::<String>()])
}

/// Parses `text` (no panic may escape) and checks that a refusal says where or what.
fn parse_and_check_error(text: &str, base: &Path, env_token: Option<String>, env_scaler_token: Option<String>) -> Result<(), TestCaseError> {
    let Err(error) = Config::parse_with_env(text, base, env_token, env_scaler_token) else { return Ok(()) };
    let error = format!("{error:#}");
    if let Some(located) = error.strip_prefix("TOML parse error at line ") {
        let reason = located.lines().last().unwrap_or_default().trim();
        prop_assert!(located.contains('\n') && !reason.is_empty(), "a TOML error without its reason: {}", error);
        return Ok(());
    }
    // The few TOML errors the parser cannot place must say what is wrong in words.
    if let Some(reason) = error.strip_prefix("TOML parse error: ") {
        prop_assert!(reason.split_whitespace().count() >= 3, "a TOML error without a place or a reason: {}", error);
        return Ok(());
    }
    let subject = ERROR_SUBJECTS.iter().find(|s| error.starts_with(**s));
    prop_assert!(subject.is_some(), "an error that names no key: {}\n--- file:\n{}", error, text);
    let rest = error.split_once(": ").map_or("", |(_, rest)| rest).trim();
    prop_assert!(!rest.is_empty(), "an error that names a key but no reason: {}", error);
    // Inside a queue, the error names the queue's key too (or is about the queue's name).
    if error.starts_with("queues.") {
        let named = QUEUE_KEYS.iter().any(|(key, _)| rest.starts_with(&format!("{key}:"))) || QUEUE_ERROR_SUBJECTS.iter().any(|s| rest.starts_with(s));
        prop_assert!(named, "a queue's error that names none of its keys: {}\n--- file:\n{}", error, text);
    }
    Ok(())
}

proptest! {
    #![proptest_config(budget(1000))]

    /// Any text (and any tokens from the environment): no panic, and every refusal names a
    /// key or the line.
    #[test]
    fn arbitrary_text_never_panics_and_every_error_names_a_key_or_a_line(
        text in prop_oneof![any::<String>(), tomlish_text()],
        env_token in env_token(),
        env_scaler_token in env_token(),
    ) {
        parse_and_check_error(&text, Path::new(BASE), env_token, env_scaler_token)?;
    }

    /// Files of real keys with hostile values (huge and negative numbers, odd duration units,
    /// wrong types), unknown keys, deep tables and nested values: no panic, and every
    /// refusal names the key or the line.
    #[test]
    fn hostile_toml_never_panics_and_every_error_names_a_key_or_a_line(text in document(), env_token in env_token(), env_scaler_token in env_token()) {
        parse_and_check_error(&text, Path::new(BASE), env_token, env_scaler_token)?;
    }
}

/// Found by the fuzzer: toml reports its nesting limit without a line ("recursion limit").
#[test]
fn a_table_nested_past_the_parsers_limit_is_refused_saying_so() {
    for text in [format!("[{}]\n", vec!["a"; 200].join(".")), format!("{} = 1\n", vec!["a"; 200].join("."))] {
        let error = format!("{:#}", Config::parse_with_env(&text, Path::new(BASE), None, None).unwrap_err());
        assert!(error.contains("nested too deeply"), "{error}");
    }
}
