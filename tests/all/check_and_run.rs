//! Issue 18: `ebb check` and `ebb run` call the same validation, so what one refuses the
//! other refuses too, with the same words; and what `run` survives (a rule file that is
//! missing or not a file: the built-in rule decides until it is fixed), `check` names.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::binary::EBB;

/// Runs `ebb <command> --config <config>`; `run` is stopped after `within` if it has not
/// exited by then (it started: the case was not refused).
fn ebb(command: &str, config: &std::path::Path, within: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(EBB).arg(command).arg("--config").arg(config).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + within;
    loop {
        if child.try_wait().unwrap().is_some() {
            let output: Output = child.wait_with_output().unwrap();
            let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
            return (output.status.code(), text);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            return (None, String::from_utf8_lossy(&output.stderr).into_owned());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn config(dir: &std::path::Path, top: &str) -> std::path::PathBuf {
    let port = ebb_tests::azurite::free_port();
    let path = dir.join("ebb.toml");
    std::fs::write(&path, format!("{top}\n[api]\nlisten = \"127.0.0.1:{port}\"\n[queues.orders]\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n"))
        .unwrap();
    path
}

#[test]
fn check_and_run_refuse_the_same_folders_with_the_same_words() {
    let long = format!("data_dir = \"{}\"", "d/".repeat(2500));
    let cases = [
        ("rules_dir = \"\"", "rules_dir: is empty"),
        ("data_dir = \"\"", "data_dir: is empty"),
        ("data_dir = \"a\\u0000b\"", "data_dir: contains a NUL character"),
        (long.as_str(), "data_dir: is 5"),
        ("data_dir = \"/proc/ebb-data\"", "data_dir: /proc/ebb-data cannot be created in /proc"),
        ("rules_dir = \"/proc/self/ebb-rules\"", "rules_dir: /proc/self/ebb-rules cannot be created in"),
    ];
    for (top, reason) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = config(dir.path(), top);
        for command in ["check", "run"] {
            let (code, text) = ebb(command, &path, Duration::from_secs(20));
            assert_eq!(code, Some(1), "ebb {command} with {top:.60}: must refuse, got {code:?}:\n{text}");
            assert!(text.contains(reason), "ebb {command} with {top:.60}: expected {reason:?} in:\n{text}");
        }
    }
}

/// Found by attack: a store file cut to 0 bytes or full of garbage was "valid" to `ebb check`
/// while `ebb run` refused it.
#[test]
fn check_and_run_refuse_a_damaged_store_alike_and_leave_it_as_it_is() {
    for (what, bytes) in [("empty", Vec::new()), ("garbage", (0..100_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect())] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ebb-data")).unwrap();
        let store = dir.path().join("ebb-data/queues.redb");
        std::fs::write(&store, &bytes).unwrap();
        let path = config(dir.path(), "");
        for command in ["check", "run"] {
            let (code, text) = ebb(command, &path, Duration::from_secs(20));
            assert_eq!(code, Some(1), "ebb {command} with an {what} store must refuse it:\n{text}");
            assert!(text.contains("queues.redb") && text.contains("is damaged or not a queue store"), "ebb {command}, {what} store:\n{text}");
        }
        assert_eq!(std::fs::read(&store).unwrap(), bytes, "the {what} store file was changed");
    }
}

#[test]
fn a_missing_or_fifo_rule_file_is_named_by_check_and_run_decides_with_the_built_in_rule() {
    for make in ["missing", "fifo"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("rules")).unwrap();
        let rule = dir.path().join("rules/orders.wasm");
        if make == "fifo" {
            assert!(Command::new("mkfifo").arg(&rule).status().unwrap().success());
        }
        let port = ebb_tests::azurite::free_port();
        let path = dir.path().join("ebb.toml");
        std::fs::write(
            &path,
            format!("[api]\nlisten = \"127.0.0.1:{port}\"\n[queues.orders]\nrule = \"orders.wasm\"\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n"),
        )
        .unwrap();
        let (code, checked) = ebb("check", &path, Duration::from_secs(20));
        assert_eq!(code, Some(1), "ebb check with a {make} rule file:\n{checked}");
        assert!(checked.contains("orders.wasm"), "{checked}");
        // `run` starts (the built-in rule decides meanwhile) and says why.
        let (code, ran) = ebb("run", &path, Duration::from_secs(3));
        assert_eq!(code, None, "ebb run with a {make} rule file should keep running:\n{ran}");
        assert!(ran.contains("orders.wasm") && ran.contains("built-in rule"), "{ran}");
    }
}

/// Issue 18: the handler URL may be left out when a program embedding ebb gives a Rust
/// handler; `ebb run` has none, so it and `ebb check` refuse such a queue with the key.
#[test]
fn check_and_run_refuse_a_queue_without_a_handler_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let port = ebb_tests::azurite::free_port();
    let path = dir.path().join("ebb.toml");
    std::fs::write(&path, format!("[api]\nlisten = \"127.0.0.1:{port}\"\n[queues.orders]\nmax_tasks = 4\n")).unwrap();
    for command in ["check", "run"] {
        let (code, text) = ebb(command, &path, Duration::from_secs(20));
        assert_eq!(code, Some(1), "ebb {command}: must refuse, got {code:?}:\n{text}");
        assert!(text.contains("queues.orders.handler: not set"), "ebb {command}: expected the key in:\n{text}");
    }
}

/// Issue 22, defect 5: `ebb check` accepted a queue whose `rule` and `shadow_rule` are hard
/// links of one file (a shadow that can only agree with the live rule, which `ebb rule
/// promote` refuses); it is refused naming the key. Two files of the same bytes are fine.
#[test]
fn check_refuses_a_shadow_rule_that_is_a_hard_link_of_the_rule_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::copy(ebb_tests::guests::PAPER_DEFAULT, rules.join("orders.wasm")).unwrap();
    std::fs::hard_link(rules.join("orders.wasm"), rules.join("candidate.wasm")).unwrap();
    let port = ebb_tests::azurite::free_port();
    let path = dir.path().join("ebb.toml");
    std::fs::write(
        &path,
        format!(
            "data_dir = \"{}\"\n[api]\nlisten = \"127.0.0.1:{port}\"\n[queues.orders]\nrule = \"orders.wasm\"\nshadow_rule = \"candidate.wasm\"\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let (code, checked) = ebb("check", &path, Duration::from_secs(60));
    assert_eq!(code, Some(1), "{checked}");
    assert!(checked.contains("queues.orders.shadow_rule:") && checked.contains("are one file (hard links)"), "{checked}");
    // A symbolic link is named as one (it was called a hard link).
    std::fs::remove_file(rules.join("candidate.wasm")).unwrap();
    std::os::unix::fs::symlink("orders.wasm", rules.join("candidate.wasm")).unwrap();
    let (code, checked) = ebb("check", &path, Duration::from_secs(60));
    assert_eq!(code, Some(1), "{checked}");
    assert!(checked.contains("are one file (one names it through a symbolic link)"), "{checked}");
    // A running host says so too (attack, session 13: it ran the shadow silently), and runs on.
    let (code, said) = ebb("run", &path, Duration::from_secs(3));
    assert_eq!(code, None, "still running after 3 s: {said}");
    assert!(said.contains("queues.orders.shadow_rule:") && said.contains("are one file"), "{said}");
    // A copy of the same bytes is another file: a shadow that agrees, which is allowed.
    std::fs::remove_file(rules.join("candidate.wasm")).unwrap();
    std::fs::copy(rules.join("orders.wasm"), rules.join("candidate.wasm")).unwrap();
    let (code, checked) = ebb("check", &path, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{checked}");
}

/// A config of one Azure queue `queue` (a fresh name) on `connection`, its API on a port
/// nobody answers (so `ebb send` writes to storage).
fn azure_config(dir: &std::path::Path, connection: &str, queue: &str) -> std::path::PathBuf {
    let port = ebb_tests::azurite::free_port();
    let path = dir.join("ebb.toml");
    std::fs::write(
        &path,
        format!(
            "[azure]\nconnection_string = \"{connection}\"\n[api]\nlisten = \"127.0.0.1:{port}\"\n[queues.{queue}]\nbackend = \"azure\"\nhandler = {{ url = \"http://127.0.0.1:9/work\" }}\n"
        ),
    )
    .unwrap();
    path
}

/// A connection string of the shared Azurite with an account SAS of `permissions`.
fn sas_connection(permissions: &str) -> String {
    let azurite = ebb_tests::azurite::Azurite::shared();
    let sas = azurite.account().account_sas(permissions, std::time::SystemTime::now() + Duration::from_secs(3600)).unwrap();
    format!("SharedAccessSignature={sas};QueueEndpoint={}", azurite.endpoint())
}

/// Whether storage queue `name` exists on the shared Azurite (asked with the account key).
async fn azure_queue_exists(name: &str) -> bool {
    use ebb::queue::QueueClient as _;
    let queue = ebb::queue::azure::AzureQueue::new(&ebb_tests::azurite::Azurite::shared().account(), name, Default::default()).unwrap();
    match queue.approximate_count().await {
        Ok(_) => true,
        Err(error) if error.failure_class() == Some(ebb::queue::FailureClass::Missing) => false,
        Err(error) => panic!("{name}: {error}"),
    }
}

/// Issue 40, item 6: for queues not created yet, a read-only SAS (`sp=rl`) and a SAS without
/// process and update passed `ebb check` (with a WARN QueueNotFound), while `ebb run` exits
/// or is never ready; `check` created the queues it called "not created yet" when it could.
/// Now `check` names what the SAS lacks (read from the SAS: nothing is created), says
/// nothing of QueueNotFound, and a SAS with all `run` needs passes, leaving no queue behind.
#[test]
fn check_refuses_a_sas_that_run_will_refuse_and_creates_no_queue() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let cases = [("rl", Some("lacks c (create), a (add), p (process), u (update)")), ("rac", Some("lacks p (process), u (update)")), ("raupc", None)];
    for (permissions, lacks) in cases {
        let queue = ebb_tests::azurite::unique_queue_name("fresh");
        let dir = tempfile::tempdir().unwrap();
        let path = azure_config(dir.path(), &sas_connection(permissions), &queue);
        let (code, text) = ebb("check", &path, Duration::from_secs(60));
        match lacks {
            Some(lacks) => {
                assert_eq!(code, Some(1), "sp={permissions}: check must refuse:\n{text}");
                assert!(text.contains(&format!("(sp={permissions}) {lacks}")), "sp={permissions}: expected {lacks:?} in:\n{text}");
            }
            None => {
                assert_eq!(code, Some(0), "sp={permissions}: {text}");
                assert!(text.contains(&format!("queue {queue}: reached on Azure; it does not exist yet")), "{text}");
            }
        }
        assert!(!text.contains("QueueNotFound") && !text.contains("WARN"), "sp={permissions}: {text}");
        for name in [queue.clone(), format!("{queue}-poison")] {
            assert!(!runtime.block_on(azure_queue_exists(&name)), "sp={permissions}: check created {name}");
        }
    }
    // `run` refuses what `check` refused: the read-only SAS cannot create the queues.
    let queue = ebb_tests::azurite::unique_queue_name("fresh");
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = ebb("run", &azure_config(dir.path(), &sas_connection("rl"), &queue), Duration::from_secs(30));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("AuthorizationPermissionMismatch"), "{text}");
}

/// Issue 40 (a leftover): `run` now starts with a SAS without create (`sp=raup`) where every
/// storage queue exists, but `check` still refused it ("lacks c (create)") and said "may
/// create" of those queues. Now `check` passes it where the queues exist, and refuses it,
/// naming the queue and `c`, where one does not.
#[test]
fn check_passes_a_sas_without_create_where_every_queue_exists_and_refuses_it_where_one_is_missing() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let queue = ebb_tests::azurite::unique_queue_name("nocreate");
    let account = ebb_tests::azurite::Azurite::shared().account();
    for name in [queue.clone(), format!("{queue}-poison")] {
        use ebb::queue::QueueClient as _;
        let storage = ebb::queue::azure::AzureQueue::new(&account, &name, Default::default()).unwrap();
        runtime.block_on(storage.create_if_missing()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = ebb("check", &azure_config(dir.path(), &sas_connection("raup"), &queue), Duration::from_secs(60));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("queue {queue}: reached on Azure, 0 messages; may read, process and update; may not create")), "{text}");
    assert!(!text.contains("may create"), "{text}");

    let fresh = ebb_tests::azurite::unique_queue_name("nocreate");
    let (code, text) = ebb("check", &azure_config(dir.path(), &sas_connection("raup"), &fresh), Duration::from_secs(60));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains(&format!("queue {fresh}: it does not exist, and the shared access signature lacks c (create)")), "{text}");
    assert!(!runtime.block_on(azure_queue_exists(&fresh)), "check created {fresh}");
}

/// Issue 40, item 6: a blob endpoint that accepts connections and never answers passed
/// `ebb check` (it was never asked); now its claim-check probe fails within its bound,
/// naming the endpoint.
#[test]
fn check_refuses_a_hanging_blob_endpoint_within_its_bound() {
    let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let blob = format!("http://127.0.0.1:{}/devstoreaccount1", hanging.local_addr().unwrap().port());
    let held = std::thread::spawn(move || hanging.incoming().take(8).filter_map(Result::ok).collect::<Vec<_>>());
    let azurite = ebb_tests::azurite::Azurite::shared();
    let queue = ebb_tests::azurite::unique_queue_name("blobs");
    let dir = tempfile::tempdir().unwrap();
    let path = azure_config(dir.path(), &format!("{};BlobEndpoint={blob}", azurite.connection_string()), &queue);
    let started = Instant::now();
    let (code, text) = ebb("check", &path, Duration::from_secs(60));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains(&blob) && text.contains("no answer within 10s"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(25), "took {:?}", started.elapsed());
    drop(held);
}

/// Issue 40, item 6: `ebb send` without a host demanded create (of `<queue>-poison`) even
/// when both queues exist; a SAS that may only add (the Message Sender's part) now sends.
#[test]
fn send_without_a_host_needs_only_the_permission_to_add() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let queue = ebb_tests::azurite::unique_queue_name("sender");
    let account = ebb_tests::azurite::Azurite::shared().account();
    for name in [queue.clone(), format!("{queue}-poison")] {
        use ebb::queue::QueueClient as _;
        let storage = ebb::queue::azure::AzureQueue::new(&account, &name, Default::default()).unwrap();
        runtime.block_on(storage.create_if_missing()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = azure_config(dir.path(), &sas_connection("a"), &queue);
    let output = Command::new(EBB).arg("send").arg("--config").arg(&path).arg(&queue).arg("hello").output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{text}");
    assert!(text.contains(&format!("sent 1 message to {queue}")), "{text}");
    let storage = ebb::queue::azure::AzureQueue::new(&account, &queue, Default::default()).unwrap();
    assert_eq!(runtime.block_on(ebb::queue::QueueClient::approximate_count(&storage)).unwrap(), 1);
}
