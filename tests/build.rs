//! Builds every rule component the tests use, once per change, into a target dir of its
//! own (so it never waits on the outer cargo's lock), and writes their paths as constants
//! (`GUEST_NAME: &str`) into `$OUT_DIR/guests.rs`. Nothing is checked in as a binary.
//!
//! - Rust: `example-rules/` and `tests/guests/` for `wasm32-wasip2` (the target is added
//!   with rustup when missing).
//! - Python and JavaScript example rules, with pinned componentize-py and componentize-qjs
//!   installed into `<target>/guest-tools/` on first use.
//! - The C example rule: bindings generated from the WIT by the `wit-bindgen-c` crate, compiled
//!   by Zig's clang (`ziglang` pinned from PyPI, in `<target>/guest-tools/zig/`, its cache of
//!   the WASI libc in `<target>/guest-tools/zig-cache/`), made a component by `wit-component`
//!   with wasmtime's WASI preview1 reactor adapter.
//! - Azurite (the Azure Storage emulator) for the Azure queue tests, pinned by
//!   `tests/azurite/package-lock.json`, installed into `<target>/azurite/` with `npm ci`
//!   whenever the lock changes; its path is `AZURITE_QUEUE` in `$OUT_DIR/azurite.rs`, and its
//!   blob service's (claim checks) `AZURITE_BLOB`.
//! - moto's server (an Amazon SQS implementation) and boto3, pinned by `tests/moto/requirements.txt`,
//!   installed into `<target>/guest-tools/moto-py/` on first use (`MOTO_PYTHON` in `$OUT_DIR/moto.rs`).
//! - the OpenTelemetry protobuf definitions and grpcio for the OTLP receiver of the telemetry tests, pinned by
//!   `tests/otlp/requirements.txt`, in `<target>/guest-tools/otlp-py/` (`$OUT_DIR/otlp.rs`).
//! - Python `grpcio` + `grpcio-tools`, pinned by `tests/scaler/requirements.txt`, installed into
//!   `<target>/guest-tools/py-grpc/` on first use, and Python stubs generated from KEDA's
//!   `host/proto/externalscaler.proto` (`PYTHON` and `STUBS` in `$OUT_DIR/python_grpc.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    // Cargo names OUT_DIR by a hash of the package's path relative to its workspace, so git
    // worktrees sharing one CARGO_TARGET_DIR share it too: each checkout's components go to
    // a folder of their own, or one checkout's build overwrites what another's tests load
    // (seen: a worktree on SDK 0.2.0 rebuilt the guests of one on 0.3.0 under its tests).
    let built = out_dir.join(checkout_folder(&root));
    std::fs::create_dir_all(&built).unwrap();
    let guest_target = built.join("guest-target");

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
    // The Python and JavaScript rules stay on contract 0.2.0 (they decide no handler
    // concurrency), which the host still serves; the Rust ones follow the SDK (0.3.0).
    let wit = root.join("wit/ebb-rules-0.2.0");
    let python_rule = built.join("python_drain_time.wasm");
    run(
        Command::new(componentize_py(&tools))
            .args(["-d", path_str(&wit), "-w", "scaling-rule", "componentize", "-p"])
            .arg(root.join("example-rules/python"))
            .args(["app", "-o", path_str(&python_rule)]),
        "componentize-py of example-rules/python",
    );
    let javascript_rule = built.join("javascript_spare_capacity.wasm");
    run(
        Command::new(componentize_qjs(&tools))
            .args(["-w", path_str(&wit), "-n", "scaling-rule", "--sync", "-j"])
            .arg(root.join("example-rules/javascript/rule.js"))
            .args(["-o", path_str(&javascript_rule)]),
        "componentize-qjs of example-rules/javascript",
    );
    let c_rule = build_c_rule(&root.join("example-rules/c/proportional.c"), &root.join("wit/ebb-rules-0.3.0"), &tools, &built);
    // The Python retry policy decides failures: contract 0.4.0's failure-aware-rule world.
    let python_retry = built.join("python_retry.wasm");
    run(
        Command::new(componentize_py(&tools))
            .args(["-d", path_str(&root.join("wit/ebb-rules-0.4.0")), "-w", "failure-aware-rule", "componentize", "-p"])
            .arg(root.join("example-rules/python-retry"))
            .args(["app", "-o", path_str(&python_retry)]),
        "componentize-py of example-rules/python-retry",
    );
    for (name, path) in
        [("PYTHON_DRAIN_TIME", python_rule), ("JAVASCRIPT_SPARE_CAPACITY", javascript_rule), ("PYTHON_RETRY", python_retry), ("C_PROPORTIONAL", c_rule)]
    {
        constants.push_str(&format!("pub const {name}: &str = {:?};\n", path.display().to_string()));
    }
    // Test guests in other languages: `tests/guests-js/<name>.js` (built with `--sync`) and
    // `tests/guests-py/<name>/app.py`, each as `JS_<NAME>` / `PY_<NAME>`.
    for (name, path) in build_other_language_guests(&root, &wit, &tools, &built) {
        constants.push_str(&format!("pub const {name}: &str = {:?};\n", path.display().to_string()));
    }
    // The pinned guest toolchains themselves, for tests that build rules as a user would.
    constants.push_str(&format!("pub const COMPONENTIZE_PY: &str = {:?};\n", path_str(&componentize_py(&tools))));
    constants.push_str(&format!("pub const COMPONENTIZE_QJS: &str = {:?};\n", path_str(&componentize_qjs(&tools))));
    constants.push_str(&format!("pub const GUEST_TOOLS: &str = {:?};\n", path_str(&tools)));
    std::fs::write(out_dir.join("guests.rs"), constants).unwrap();

    // KEDA's scaler protocol, for a client from another toolchain: Python grpcio, with
    // stubs generated by grpcio-tools from the proto the host is built from.
    let proto = root.join("host/proto/externalscaler.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    println!("cargo:rerun-if-changed={}", root.join("tests/scaler").display());
    let python = pinned_python(&tools, "py-grpc", &root.join("tests/scaler/requirements.txt"));
    let stubs = out_dir.join("python-scaler-client");
    std::fs::create_dir_all(&stubs).unwrap();
    run(
        Command::new(&python)
            .args(["-m", "grpc_tools.protoc", "-I"])
            .arg(proto.parent().unwrap())
            .arg(format!("--python_out={}", path_str(&stubs)))
            .arg(format!("--grpc_python_out={}", path_str(&stubs)))
            .arg(&proto),
        "grpc_tools.protoc of host/proto/externalscaler.proto",
    );
    std::fs::write(
        out_dir.join("python_grpc.rs"),
        format!("pub const PYTHON: &str = {:?};\npub const STUBS: &str = {:?};\n", path_str(&python), path_str(&stubs)),
    )
    .unwrap();

    println!("cargo:rerun-if-changed={}", root.join("tests/azurite").display());
    let azurite = install_azurite(&root.join("tests/azurite"), &out_dir.ancestors().nth(4).unwrap().join("azurite"));
    // The blob service (claim checks) comes in the same package, beside the queue service.
    let azurite_blob = azurite.with_file_name("azurite-blob");
    std::fs::write(
        out_dir.join("azurite.rs"),
        format!("pub const AZURITE_QUEUE: &str = {:?};\npub const AZURITE_BLOB: &str = {:?};\n", path_str(&azurite), path_str(&azurite_blob)),
    )
    .unwrap();
    println!("cargo:rerun-if-changed={}", root.join("tests/azure-sdk").display());
    let azure_python = pinned_python(&tools, "azure-py", &root.join("tests/azure-sdk/requirements.txt"));
    std::fs::write(
        out_dir.join("azure_sdk.rs"),
        format!(
            "pub const AZURE_SDK_PYTHON: &str = {:?};\npub const AZURE_SDK_INTEROP: &str = {:?};\n",
            path_str(&azure_python),
            path_str(&root.join("tests/azure-sdk/interop.py"))
        ),
    )
    .unwrap();
    // Amazon SQS for the SQS tests: moto's server, with boto3 for interop, in a venv of their own.
    println!("cargo:rerun-if-changed={}", root.join("tests/moto").display());
    let moto_python = pinned_python(&tools, "moto-py", &root.join("tests/moto/requirements.txt"));
    std::fs::write(out_dir.join("moto.rs"), format!("pub const MOTO_PYTHON: &str = {:?};\n", path_str(&moto_python))).unwrap();
    // The OTLP receiver of the telemetry tests: the OpenTelemetry protobuf definitions in a venv.
    println!("cargo:rerun-if-changed={}", root.join("tests/otlp").display());
    let otlp_python = pinned_python(&tools, "otlp-py", &root.join("tests/otlp/requirements.txt"));
    let receiver = root.join("tests/otlp/receiver.py");
    std::fs::write(
        out_dir.join("otlp.rs"),
        format!("pub const OTLP_PYTHON: &str = {:?};\npub const OTLP_RECEIVER: &str = {:?};\n", path_str(&otlp_python), path_str(&receiver)),
    )
    .unwrap();
    let redis = ensure_redis_server();
    std::fs::write(out_dir.join("redis.rs"), format!("pub const REDIS_SERVER: &str = {:?};\n", path_str(&redis))).unwrap();
    let (chromium, chromedriver) = ensure_chromium();
    std::fs::write(
        out_dir.join("chromium.rs"),
        format!("pub const CHROMIUM: &str = {:?};\npub const CHROMEDRIVER: &str = {:?};\n", path_str(&chromium), path_str(&chromedriver)),
    )
    .unwrap();
}

/// Debian's `chromium` and `chromium-driver` (the console's browser tests drive a headless
/// Chromium through WebDriver): installed with apt when either is missing, like
/// `redis-server`. Returns the browser and the driver.
fn ensure_chromium() -> (PathBuf, PathBuf) {
    let runs = |p: &Path| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success());
    let found = || {
        let browser = ["/usr/bin/chromium", "/usr/local/bin/chromium"].into_iter().map(PathBuf::from).find(|p| runs(p))?;
        let driver = ["/usr/bin/chromedriver", "/usr/local/bin/chromedriver"].into_iter().map(PathBuf::from).find(|p| runs(p))?;
        Some((browser, driver))
    };
    if let Some(found) = found() {
        return found;
    }
    let apt = |args: &[&str]| Command::new("apt-get").args(args).env("DEBIAN_FRONTEND", "noninteractive").status().is_ok_and(|s| s.success());
    let install = ["install", "-y", "-q", "--no-install-recommends", "chromium", "chromium-driver"];
    if !apt(&install) {
        assert!(
            apt(&["update", "-q"]) && apt(&install),
            "apt-get install chromium chromium-driver failed: the console's browser tests need Debian's chromium and chromium-driver (run as root, or install them)"
        );
    }
    found().expect("apt-get installed chromium and chromium-driver, but /usr/bin/chromium or /usr/bin/chromedriver does not run")
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
        ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()))
    };
    if let Some(path) = found() {
        return path;
    }
    let apt = |args: &[&str]| Command::new("apt-get").args(args).env("DEBIAN_FRONTEND", "noninteractive").status().is_ok_and(|s| s.success());
    let install = ["install", "-y", "-q", "--no-install-recommends", "redis-server"];
    if !apt(&install) {
        // A fresh machine may have no package lists yet.
        assert!(
            apt(&["update", "-q"]) && apt(&install),
            "apt-get install redis-server failed: the bus tests need Debian's redis-server (run as root, or install it)"
        );
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

/// A Python virtualenv of its own under `tools/<name>` with the packages pinned in
/// `requirements` (installed again when the pins change). Returns its `python`.
fn pinned_python(tools: &Path, name: &str, requirements: &Path) -> PathBuf {
    let venv = tools.join(name);
    let python = venv.join("bin/python");
    let pins = std::fs::read(requirements).unwrap_or_else(|e| panic!("{} is missing: {e}", requirements.display()));
    let installed = venv.join("installed-requirements.txt");
    if python.exists() && std::fs::read(&installed).ok().as_ref() == Some(&pins) {
        return python;
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv), &format!("python3 -m venv {}", venv.display()));
    run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", "-r"]).arg(requirements), &format!("pip install -r {}", requirements.display()));
    std::fs::write(&installed, &pins).unwrap();
    python
}

/// Zig from PyPI, for its C compiler (clang with a WASI libc for `wasm32-wasi`).
const ZIGLANG: &str = "ziglang==0.17.0";

/// The Python of a virtualenv holding the pinned `ziglang` (installed on first use): the
/// compiler runs as `python -m ziglang cc`, wherever the wheel put its binary.
fn zig_python(tools: &Path) -> PathBuf {
    let venv = tools.join("zig");
    let python = venv.join("bin/python");
    let marker = venv.join(ZIGLANG);
    if !marker.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv (for ziglang)");
        run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", ZIGLANG]), "pip install ziglang");
        std::fs::write(&marker, "").unwrap();
    }
    python
}

/// The C example rule as a component of contract 0.3.0, the way a C author makes one with
/// released tools, but without installing CLIs: C bindings generated from the WIT by
/// wit-bindgen-c, the rule and bindings compiled by Zig's clang into a WASI preview1 reactor
/// module, and that module made a component with the preview1 reactor adapter of the
/// wasmtime the host runs (wit-component). Returns the component's path.
fn build_c_rule(source: &Path, wit: &Path, tools: &Path, out_dir: &Path) -> PathBuf {
    let bindings = out_dir.join("c-bindings");
    std::fs::create_dir_all(&bindings).unwrap();
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve.push_dir(wit).unwrap_or_else(|e| panic!("reading {}: {e:#}", wit.display()));
    let world = resolve.select_world(&[package], Some("scaling-rule")).unwrap();
    let mut files = wit_bindgen_core::Files::default();
    wit_bindgen_c::Opts::default().build().generate(&mut resolve, world, &mut files).unwrap_or_else(|e| panic!("wit-bindgen-c of {}: {e:#}", wit.display()));
    for (name, contents) in files.iter() {
        write_if_changed(&bindings.join(name), contents);
    }

    let core = out_dir.join("c_proportional.core.wasm");
    let zig_cache = tools.join("zig-cache");
    run(
        Command::new(zig_python(tools))
            .args([
                "-m",
                "ziglang",
                "cc",
                "--target=wasm32-wasi",
                "-mexec-model=reactor",
                "-O2",
                "-s",
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-Wl,-z,stack-size=1048576",
                "-I",
            ])
            .arg(&bindings)
            .arg(source)
            .arg(bindings.join("scaling_rule.c"))
            .arg(bindings.join("scaling_rule_component_type.o"))
            .arg("-o")
            .arg(&core)
            // Zig builds its WASI libc once and keeps it here, not in the user's home.
            .env("ZIG_GLOBAL_CACHE_DIR", &zig_cache)
            .env("ZIG_LOCAL_CACHE_DIR", &zig_cache),
        &format!("zig cc of {}", source.display()),
    );
    let module = std::fs::read(&core).unwrap();
    let component = wit_component::ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .and_then(|encoder| {
            encoder.adapter(
                wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
                wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
            )
        })
        .and_then(|mut encoder| encoder.encode())
        .unwrap_or_else(|e| panic!("making a component of {}: {e:#}", core.display()));
    let wasm = out_dir.join("c_proportional.wasm");
    write_if_changed(&wasm, &component);
    wasm
}

/// Writes only when the bytes differ, so that what depends on the file's time (zig's cache,
/// a test's compile cache) sees no change when there is none.
fn write_if_changed(path: &Path, contents: &[u8]) {
    if std::fs::read(path).ok().as_deref() != Some(contents) {
        std::fs::write(path, contents).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
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

/// Builds `tests/guests-js/*.js` and `tests/guests-py/*/app.py` into `out_dir`; returns
/// (constant name, component path), sorted.
fn build_other_language_guests(root: &Path, wit: &Path, tools: &Path, out_dir: &Path) -> Vec<(String, PathBuf)> {
    let mut built = Vec::new();
    for (folder, prefix) in [("tests/guests-js", "JS_"), ("tests/guests-py", "PY_")] {
        let dir = root.join(folder);
        println!("cargo:rerun-if-changed={}", dir.display());
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut sources: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        sources.sort();
        for source in sources {
            let mut stem = source.file_stem().unwrap().to_string_lossy().into_owned();
            // `<name>.nosync.js` is built without `--sync`, as an author who forgot it would:
            // its constant is `JS_<NAME>_NOSYNC`.
            let sync = match stem.strip_suffix(".nosync") {
                Some(name) => {
                    stem = format!("{name}_nosync");
                    false
                }
                None => true,
            };
            let wasm = out_dir.join(format!("{}{stem}.wasm", prefix.to_lowercase()));
            if prefix == "JS_" {
                if source.extension().is_none_or(|e| e != "js") {
                    continue;
                }
                let mut qjs = Command::new(componentize_qjs(tools));
                qjs.args(["-w", path_str(wit), "-n", "scaling-rule"]);
                if sync {
                    qjs.arg("--sync");
                }
                run(qjs.arg("-j").arg(&source).args(["-o", path_str(&wasm)]), &format!("componentize-qjs of {}", source.display()));
            } else {
                if !source.join("app.py").is_file() {
                    continue;
                }
                run(
                    Command::new(componentize_py(tools)).args(["-d", path_str(wit), "-w", "scaling-rule", "componentize", "-p"]).arg(&source).args([
                        "app",
                        "-o",
                        path_str(&wasm),
                    ]),
                    &format!("componentize-py of {}", source.display()),
                );
            }
            built.push((format!("{prefix}{}", const_name(&stem)), wasm));
        }
    }
    built
}

/// `checkout-<hash of the checkout's path>`: a folder name of its own for each checkout.
fn checkout_folder(root: &Path) -> String {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same name for the same checkout, build after build.
    let mut hasher = std::hash::DefaultHasher::new();
    root.hash(&mut hasher);
    format!("checkout-{:016x}", hasher.finish())
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
    cargo.current_dir(workspace).args(["build", "--release", "--target", "wasm32-wasip2", "--workspace"]).env("CARGO_TARGET_DIR", target_dir);
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
