//! Builds every rule component the tests use, once per change, into a target dir of its
//! own (so it never waits on the outer cargo's lock), and writes their paths as constants
//! (`GUEST_NAME: &str`) into `$OUT_DIR/guests.rs`. Nothing is checked in as a binary.
//!
//! - Rust: `example-rules/` and `tests/guests/` for `wasm32-wasip2` (the target is added
//!   with rustup when missing).
//! - Python and JavaScript example rules, with pinned componentize-py and componentize-qjs
//!   installed into `<target>/guest-tools/` on first use.
//! - Azurite (the Azure Storage emulator) for the Azure queue tests, pinned by
//!   `tests/azurite/package-lock.json`, installed into `<target>/azurite/` with `npm ci`
//!   whenever the lock changes; its path is `AZURITE_QUEUE` in `$OUT_DIR/azurite.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let guest_target = out_dir.join("guest-target");

    for watched in ["rules-sdk", "wit", "example-rules", "tests/guests"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    ensure_wasm_target();
    let mut constants = String::new();
    // (the Python and JavaScript rules are appended below)
    for workspace in ["example-rules", "tests/guests"] {
        for (name, path) in build_rust_workspace(&root.join(workspace), &guest_target) {
            constants.push_str(&format!("pub const {}: &str = {:?};\n", const_name(&name), path.display().to_string()));
        }
    }
    // Tools live beside the target dir's profiles, so a new OUT_DIR does not reinstall them.
    let tools = out_dir.ancestors().nth(4).unwrap().join("guest-tools");
    let wit = root.join("wit/ebb-rules-0.1.0");
    let python_rule = out_dir.join("python_drain_time.wasm");
    run(
        Command::new(componentize_py(&tools))
            .args(["-d", path_str(&wit), "-w", "scaling-rule", "componentize", "-p"])
            .arg(root.join("example-rules/python"))
            .args(["app", "-o", path_str(&python_rule)]),
        "componentize-py of example-rules/python",
    );
    let javascript_rule = out_dir.join("javascript_spare_capacity.wasm");
    run(
        Command::new(componentize_qjs(&tools))
            .args(["-w", path_str(&wit), "-n", "scaling-rule", "--sync", "-j"])
            .arg(root.join("example-rules/javascript/rule.js"))
            .args(["-o", path_str(&javascript_rule)]),
        "componentize-qjs of example-rules/javascript",
    );
    for (name, path) in [("PYTHON_DRAIN_TIME", python_rule), ("JAVASCRIPT_SPARE_CAPACITY", javascript_rule)] {
        constants.push_str(&format!("pub const {name}: &str = {:?};\n", path.display().to_string()));
    }
    std::fs::write(out_dir.join("guests.rs"), constants).unwrap();

    println!("cargo:rerun-if-changed={}", root.join("tests/azurite").display());
    let azurite = install_azurite(&root.join("tests/azurite"), &out_dir.ancestors().nth(4).unwrap().join("azurite"));
    std::fs::write(out_dir.join("azurite.rs"), format!("pub const AZURITE_QUEUE: &str = {:?};\n", path_str(&azurite))).unwrap();
    println!("cargo:rerun-if-changed={}", root.join("tests/azure-sdk").display());
    let azure_python = azure_sdk_python(&tools, &root.join("tests/azure-sdk/requirements.txt"));
    std::fs::write(
        out_dir.join("azure_sdk.rs"),
        format!(
            "pub const AZURE_SDK_PYTHON: &str = {:?};\npub const AZURE_SDK_INTEROP: &str = {:?};\n",
            path_str(&azure_python),
            path_str(&root.join("tests/azure-sdk/interop.py"))
        ),
    )
    .unwrap();
    let redis = ensure_redis_server();
    std::fs::write(out_dir.join("redis.rs"), format!("pub const REDIS_SERVER: &str = {:?};\n", path_str(&redis))).unwrap();
}

/// Azurite from npm, exactly as `tests/azurite/package-lock.json` pins it, in a
/// node_modules of its own; reinstalled when the lock changes. Returns `azurite-queue`.
fn install_azurite(pinned: &Path, prefix: &Path) -> PathBuf {
    let tool = prefix.join("node_modules/.bin/azurite-queue");
    let lock = std::fs::read(pinned.join("package-lock.json")).expect("tests/azurite/package-lock.json is missing");
    let installed_lock = prefix.join("installed-package-lock.json");
    if tool.exists() && std::fs::read(&installed_lock).ok().as_ref() == Some(&lock) {
        return tool;
    }
    std::fs::create_dir_all(prefix).unwrap();
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(pinned.join(file), prefix.join(file)).unwrap();
    }
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--silent", "--prefix"])
        .arg(prefix)
        .status()
        .unwrap_or_else(|e| panic!("failed to start npm to install Azurite for the Azure queue tests (install Node.js 20+ and npm): {e}"));
    assert!(status.success(), "npm ci of Azurite into {} failed ({status})", prefix.display());
    assert!(tool.exists(), "npm ci did not install {}", tool.display());
    std::fs::write(&installed_lock, &lock).unwrap();
    tool
}

/// Debian's `redis-server` (the push-notification bus tests start their own on a free
/// port): installed with apt when it is not on the machine. CI runs as root on a Debian
/// machine; elsewhere, install the `redis-server` package.
fn ensure_redis_server() -> PathBuf {
    let found = || {
        ["/usr/bin/redis-server", "/usr/local/bin/redis-server"].into_iter().map(PathBuf::from).find(|p| {
            Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success())
        })
    };
    if let Some(path) = found() {
        return path;
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get").args(args).env("DEBIAN_FRONTEND", "noninteractive").status().is_ok_and(|s| s.success())
    };
    let install = ["install", "-y", "-q", "--no-install-recommends", "redis-server"];
    if !apt(&install) {
        // A fresh machine may have no package lists yet.
        assert!(apt(&["update", "-q"]) && apt(&install), "apt-get install redis-server failed: the bus tests need Debian's redis-server (run as root, or install it)");
    }
    found().expect("apt-get installed redis-server, but /usr/bin/redis-server does not run")
}

/// Pinned guest toolchains, from PyPI and npm.
const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";
const COMPONENTIZE_QJS: &str = "componentize-qjs@0.4.5";

/// componentize-py in a virtualenv of its own, installed on first use.
fn componentize_py(tools: &Path) -> PathBuf {
    let venv = tools.join("py");
    let tool = venv.join("bin/componentize-py");
    let marker = venv.join(COMPONENTIZE_PY);
    if !marker.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv (for componentize-py)");
        run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", COMPONENTIZE_PY]), "pip install componentize-py");
        std::fs::write(&marker, "").unwrap();
    }
    tool
}

/// A Python with the official Azure Storage Queues SDK (pinned in `requirements`), in a
/// venv of its own, installed again when the requirements change.
fn azure_sdk_python(tools: &Path, requirements: &Path) -> PathBuf {
    let venv = tools.join("azure-py");
    let python = venv.join("bin/python");
    let wanted = std::fs::read(requirements).expect("tests/azure-sdk/requirements.txt is missing");
    let marker = venv.join("installed-requirements.txt");
    if python.exists() && std::fs::read(&marker).ok().as_ref() == Some(&wanted) {
        return python;
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv (for the Azure SDK)");
    run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", "-r"]).arg(requirements), "pip install the Azure Storage Queues SDK");
    std::fs::write(&marker, &wanted).unwrap();
    python
}

/// componentize-qjs in a node_modules of its own, installed on first use.
fn componentize_qjs(tools: &Path) -> PathBuf {
    let prefix = tools.join("js");
    let tool = prefix.join("node_modules/.bin/componentize-qjs");
    let marker = prefix.join(COMPONENTIZE_QJS);
    if !marker.exists() {
        std::fs::create_dir_all(&prefix).unwrap();
        run(
            Command::new("npm").args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"]).arg(&prefix).arg(COMPONENTIZE_QJS),
            "npm install componentize-qjs",
        );
        std::fs::write(&marker, "").unwrap();
    }
    tool
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("paths are UTF-8")
}

fn ensure_wasm_target() {
    let installed = Command::new("rustup").args(["target", "list", "--installed"]).output();
    if let Ok(out) = &installed
        && String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == "wasm32-wasip2")
    {
        return;
    }
    run(Command::new("rustup").args(["target", "add", "wasm32-wasip2"]), "rustup target add wasm32-wasip2");
}

/// Builds a guest workspace in release mode and returns (package name, component path).
fn build_rust_workspace(workspace: &Path, target_dir: &Path) -> Vec<(String, PathBuf)> {
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .current_dir(workspace)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--workspace"])
        .env("CARGO_TARGET_DIR", target_dir);
    // The outer build's flags and profile settings are for the host, not for the guests.
    for (key, _) in std::env::vars() {
        if key.starts_with("CARGO_ENCODED_RUSTFLAGS") || key == "RUSTFLAGS" || key.starts_with("CARGO_PROFILE_") || key == "CARGO_BUILD_TARGET" {
            cargo.env_remove(&key);
        }
    }
    run(&mut cargo, &format!("cargo build of the guests in {}", workspace.display()));
    let release = target_dir.join("wasm32-wasip2/release");
    let mut built = Vec::new();
    for entry in std::fs::read_dir(workspace).unwrap().flatten() {
        let manifest = entry.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else { continue };
        let Some(name) = text.lines().find_map(|l| l.strip_prefix("name = ").map(|n| n.trim_matches('"').to_string())) else {
            continue;
        };
        let wasm = release.join(format!("{}.wasm", name.replace('-', "_")));
        assert!(wasm.exists(), "guest {name} did not produce {}", wasm.display());
        built.push((name, wasm));
    }
    built.sort();
    built
}

fn const_name(name: &str) -> String {
    name.to_uppercase().replace('-', "_")
}

fn run(command: &mut Command, what: &str) {
    let status = command.status().unwrap_or_else(|e| panic!("failed to start {what}: {e}"));
    assert!(status.success(), "{what} failed ({status})");
}
