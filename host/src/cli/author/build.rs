//! `ebb rule build [FOLDER]`: builds a rule folder into `NAME.wasm` with the right toolchain
//! and the flags that matter (the component target, `--sync`, the pinned tool versions).
//!
//! Nothing from the folder is run as shell text: each tool is started with an argument list,
//! and the only names taken from the folder (the manifest's, or a Cargo package's) are
//! validated like `ebb rule new`'s. The Python and JavaScript tools are installed on first use
//! into a tool cache laid out as tests/build.rs lays out its `guest-tools` (`py/`, `js/`, a
//! marker file named after the pinned version), so one can stand in for the other.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use super::{Lang, Manifest, validate_name};

/// Pinned guest toolchains (the versions tests/build.rs builds the test guests with).
pub(crate) const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";
pub(crate) const COMPONENTIZE_QJS: &str = "componentize-qjs@0.4.5";

/// Environment variable naming the tool cache (componentize-py, componentize-qjs).
pub(crate) const TOOL_CACHE_ENV: &str = "EBB_TOOL_CACHE";

/// The folder `ebb rule build` writes its own files into, inside the rule's folder.
const BUILD_DIR: &str = ".ebb-build";

/// Where a Python rule's bindings are written, for its native test (test_app.py adds it to
/// the module path).
const PYTHON_BINDINGS: &str = "bindings";

const JS_CONSOLE: &str = include_str!("../../../templates/js-build/console.js");
const JS_ENTRY: &str = include_str!("../../../templates/js-build/entry.js");
const JS_WORLD: &str = include_str!("../../../templates/js-build/world.wit");
const WASI_IO: &str = include_str!("../../../templates/js-build/wasi-io.wit");
const WASI_CLI: &str = include_str!("../../../templates/js-build/wasi-cli.wit");

const RUST_HINT: &str = "install Rust with rustup (https://rustup.rs), then `rustup target add wasm32-wasip2`";
const PYTHON_HINT: &str = "install Python 3 with its venv module (Debian/Ubuntu: `apt-get install python3 python3-venv`)";
const NODE_HINT: &str = "install Node.js 20 or later with npm (https://nodejs.org; Debian/Ubuntu: `apt-get install nodejs npm`)";

/// Builds the rule in `folder` and prints where the component is and what to do next.
pub(crate) fn run(folder: &Path) -> Result<()> {
    let started = Instant::now();
    let (name, lang) = detect(folder)?;
    let (name, wasm) = match lang {
        Lang::Rust => build_rust(folder, name.as_deref())?,
        Lang::Python => {
            let name = name.context("a Python rule is named")?;
            let wasm = build_python(folder, &name)?;
            (name, wasm)
        }
        Lang::Js => {
            let name = name.context("a JavaScript rule is named")?;
            let wasm = build_js(folder, &name)?;
            (name, wasm)
        }
    };
    let size = std::fs::metadata(&wasm).map(|m| m.len()).unwrap_or_default();
    let cases = folder.join("cases.toml");
    println!();
    println!("built {name} ({}) in {:.1} s: {} ({size} bytes)", lang.as_str(), started.elapsed().as_secs_f64(), wasm.display());
    if lang == Lang::Python {
        println!("(the bindings app.py imports are in {}: `python3 -m unittest` runs the tests natively)", folder.join(PYTHON_BINDINGS).display());
    }
    println!("next:");
    println!("  ebb rule test {} {}    # the cases, against the component", wasm.display(), cases.display());
    println!("  ebb rule check {}    # add --param per_task=32 for each rule parameter", wasm.display());
    println!("  cp {} <the host's rules folder>/    # the host swaps it in while it runs", wasm.display());
    Ok(())
}

/// The rule's name (when known before building) and language: from the manifest `ebb rule new`
/// wrote, else from the files present (Cargo.toml, app.py, rule.js; a Python or JavaScript
/// rule is then named after its folder).
fn detect(folder: &Path) -> Result<(Option<String>, Lang)> {
    if !folder.exists() {
        bail!("{} does not exist: give the folder of a rule (`ebb rule new NAME --lang rust|python|js` makes one)", folder.display());
    }
    if !folder.is_dir() {
        bail!("{} is not a folder: give the folder of a rule (`ebb rule new NAME --lang rust|python|js` makes one)", folder.display());
    }
    if let Some(manifest) = Manifest::read(folder)? {
        return Ok((Some(manifest.name), manifest.lang));
    }
    let lang = if folder.join("Cargo.toml").is_file() {
        return Ok((None, Lang::Rust));
    } else if folder.join("app.py").is_file() {
        Lang::Python
    } else if folder.join("rule.js").is_file() {
        Lang::Js
    } else {
        bail!(
            "no rule in {}: it has no {} (written by `ebb rule new`), Cargo.toml, app.py or rule.js; start one with `ebb rule new NAME --lang rust|python|js`",
            folder.display(),
            super::MANIFEST
        );
    };
    let absolute = std::path::absolute(folder).with_context(|| format!("cannot resolve folder {}", folder.display()))?;
    let named = absolute.components().next_back().map(|c| c.as_os_str().to_string_lossy().into_owned()).unwrap_or_default();
    validate_name(&named)
        .with_context(|| format!("the rule is named after its folder {}; or write {} with name and lang", absolute.display(), super::MANIFEST))?;
    Ok((Some(named), lang))
}

/// The tool cache: `$EBB_TOOL_CACHE`, else `$XDG_CACHE_HOME/ebb/tools`, else `~/.cache/ebb/tools`.
fn tool_cache() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(TOOL_CACHE_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()).map(PathBuf::from);
    let base = base.or_else(|| std::env::var_os("HOME").filter(|d| !d.is_empty()).map(|home| PathBuf::from(home).join(".cache")));
    match base {
        Some(base) => Ok(base.join("ebb").join("tools")),
        None => bail!("no folder for the build tools: set {TOOL_CACHE_ENV} (or HOME) to a folder they can be installed into"),
    }
}

/// Runs `command`, its output going to ours. A tool that is not installed is an error saying
/// how to install it (`hint`); a failure names `what` failed.
fn run_tool(command: &mut Command, what: &str, hint: &str) -> Result<()> {
    let program = command.get_program().to_string_lossy().into_owned();
    let status = match command.status() {
        Ok(status) => status,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!("{program} is not installed (or not on PATH): {hint}"),
        Err(error) => bail!("failed to start {program} for {what}: {error}"),
    };
    if !status.success() {
        bail!("{what} failed ({status}); its output is above");
    }
    Ok(())
}

/// The output of `command` when it ran and succeeded; errors as in [`run_tool`].
fn tool_output(command: &mut Command, what: &str, hint: &str) -> Result<String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let output = match command.output() {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!("{program} is not installed (or not on PATH): {hint}"),
        Err(error) => bail!("failed to start {program} for {what}: {error}"),
    };
    if !output.status.success() {
        bail!("{what} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Moves a component built into `built` to `folder/NAME.wasm` (a rename: a failed build
/// leaves the previous component whole).
fn put_in_place(built: &Path, folder: &Path, name: &str) -> Result<PathBuf> {
    let wasm = folder.join(format!("{name}.wasm"));
    std::fs::rename(built, &wasm).with_context(|| format!("failed to move {} to {}", built.display(), wasm.display()))?;
    Ok(wasm)
}

/// A fresh `.ebb-build` in `folder`, for the build's own files.
fn build_dir(folder: &Path) -> Result<PathBuf> {
    let dir = folder.join(BUILD_DIR);
    // Not followed: a rule folder from elsewhere could point it at any folder, and the build
    // writes files of fixed names into it.
    match std::fs::symlink_metadata(&dir) {
        // Emptied (links inside removed, not followed): the build writes fresh files.
        Ok(meta) if meta.is_dir() => {
            std::fs::remove_dir_all(&dir).with_context(|| format!("failed to empty folder {}", dir.display()))?;
            std::fs::create_dir(&dir).with_context(|| format!("failed to create folder {}", dir.display()))?;
        }
        Ok(_) => bail!("{} is not the folder `ebb rule build` writes its own files into (a link or a file): remove it", dir.display()),
        Err(_) => std::fs::create_dir(&dir).with_context(|| format!("failed to create folder {}", dir.display()))?,
    }
    Ok(dir)
}

fn build_rust(folder: &Path, name: Option<&str>) -> Result<(String, PathBuf)> {
    tool_output(Command::new("cargo").arg("--version"), "cargo --version", RUST_HINT)?;
    // Without rustup (a distribution's Rust), cargo's own error names the missing target.
    if let Ok(installed) = Command::new("rustup").args(["target", "list", "--installed"]).current_dir(folder).output()
        && installed.status.success()
        && !String::from_utf8_lossy(&installed.stdout).lines().any(|l| l.trim() == "wasm32-wasip2")
    {
        bail!("the Rust target wasm32-wasip2 is not installed: run `rustup target add wasm32-wasip2`, then `ebb rule build` again");
    }
    let metadata = tool_output(
        Command::new("cargo").args(["metadata", "--format-version", "1", "--no-deps"]).current_dir(folder),
        &format!("cargo metadata in {}", folder.display()),
        RUST_HINT,
    )?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata).context("cargo metadata printed something other than JSON")?;
    let target_dir = metadata["target_directory"].as_str().context("cargo metadata names no target directory")?;
    // (package, library target) of each cdylib in the workspace.
    let cdylibs: Vec<(String, String)> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|package| {
            let package_name = package["name"].as_str().unwrap_or_default().to_string();
            package["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "cdylib")))
                .map(move |target| (package_name.clone(), target["name"].as_str().unwrap_or_default().to_string()))
        })
        .collect();
    let (package, library) = match name {
        Some(name) => cdylibs
            .iter()
            .find(|(package, _)| package == name)
            .with_context(|| format!("{} has no package {name} with crate-type = [\"cdylib\"] (a rule is a cdylib)", folder.display()))?,
        None => match cdylibs.as_slice() {
            [one] => one,
            [] => bail!("{} has no package with crate-type = [\"cdylib\"]: a rule is a cdylib (see `ebb rule new NAME --lang rust`)", folder.display()),
            _ => bail!("{} has several cdylib packages: write {} with the rule's name and lang = \"rust\"", folder.display(), super::MANIFEST),
        },
    };
    validate_name(package).with_context(|| format!("the rule is named after its package in {}", folder.display()))?;
    run_tool(
        Command::new("cargo").args(["build", "--release", "--target", "wasm32-wasip2", "--package", package]).current_dir(folder),
        &format!("cargo build of {}", folder.display()),
        RUST_HINT,
    )?;
    let artifact = Path::new(target_dir).join("wasm32-wasip2/release").join(format!("{}.wasm", library.replace('-', "_")));
    let staged = build_dir(folder)?.join(format!("{package}.wasm"));
    std::fs::copy(&artifact, &staged).with_context(|| format!("cargo built, but {} cannot be copied", artifact.display()))?;
    Ok((package.clone(), put_in_place(&staged, folder, package)?))
}

/// componentize-py in the tool cache's `py/` virtualenv, installed on first use.
fn componentize_py() -> Result<PathBuf> {
    let venv = tool_cache()?.join("py");
    let tool = venv.join("bin/componentize-py");
    if venv.join(COMPONENTIZE_PY).exists() && tool.exists() {
        return Ok(tool);
    }
    tool_output(Command::new("python3").arg("--version"), "python3 --version", PYTHON_HINT)?;
    eprintln!("installing {COMPONENTIZE_PY} into {} (once)", venv.display());
    run_tool(Command::new("python3").args(["-m", "venv"]).arg(&venv), &format!("python3 -m venv {}", venv.display()), PYTHON_HINT)
        .context("the Python build tool is installed into a virtualenv (Debian/Ubuntu: `apt-get install python3-venv`)")?;
    run_tool(Command::new(venv.join("bin/pip")).args(["install", "--quiet", COMPONENTIZE_PY]), &format!("pip install {COMPONENTIZE_PY}"), PYTHON_HINT)?;
    std::fs::write(venv.join(COMPONENTIZE_PY), "").with_context(|| format!("failed to write into {}", venv.display()))?;
    Ok(tool)
}

fn build_python(folder: &Path, name: &str) -> Result<PathBuf> {
    let hint = "the contract is written into wit/ by `ebb rule new NAME --lang python`; copy wit/rules.wit from a new rule";
    if !folder.join("wit").is_dir() {
        bail!("{} has no wit/ folder: {hint}", folder.display());
    }
    if !folder.join("app.py").is_file() {
        bail!("{} has no app.py: the rule's module (see `ebb rule new NAME --lang python`)", folder.display());
    }
    let tool = componentize_py()?;
    let with_contract = |command: &mut Command| {
        command.current_dir(folder).args(["-d", "wit", "-w", "scaling-rule"]);
    };
    // The bindings `app.py` imports, for the native unit test only: stubs, kept out of the
    // module path of the component (componentize makes its own) in a folder of their own.
    // componentize-py refuses to write over them: the last build's are removed (only a real
    // folder: anything else there is not ebb's to remove).
    let written = folder.join(PYTHON_BINDINGS);
    match std::fs::symlink_metadata(&written) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&written).with_context(|| format!("failed to remove the old bindings {}", written.display()))?,
        Ok(_) => bail!("{} is not the folder of bindings `ebb rule build` writes: move it away", written.display()),
        Err(_) => {}
    }
    let mut bindings = Command::new(&tool);
    with_contract(&mut bindings);
    run_tool(bindings.args(["bindings", PYTHON_BINDINGS]), "componentize-py bindings", PYTHON_HINT)?;
    let staged = Path::new(BUILD_DIR).join(format!("{name}.wasm"));
    build_dir(folder)?;
    let mut componentize = Command::new(&tool);
    with_contract(&mut componentize);
    run_tool(componentize.args(["componentize", "-p", ".", "app", "-o"]).arg(&staged), "componentize-py componentize", PYTHON_HINT)?;
    put_in_place(&folder.join(staged), folder, name)
}

/// componentize-qjs in the tool cache's `js/` node_modules, installed on first use.
fn componentize_qjs() -> Result<PathBuf> {
    let prefix = tool_cache()?.join("js");
    let tool = prefix.join("node_modules/.bin/componentize-qjs");
    tool_output(Command::new("node").arg("--version"), "node --version", NODE_HINT)?;
    if prefix.join(COMPONENTIZE_QJS).exists() && tool.exists() {
        return Ok(tool);
    }
    std::fs::create_dir_all(&prefix).with_context(|| format!("failed to create folder {}", prefix.display()))?;
    eprintln!("installing {COMPONENTIZE_QJS} into {} (once)", prefix.display());
    run_tool(
        Command::new("npm").args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"]).arg(&prefix).arg(COMPONENTIZE_QJS),
        &format!("npm install {COMPONENTIZE_QJS}"),
        NODE_HINT,
    )?;
    std::fs::write(prefix.join(COMPONENTIZE_QJS), "").with_context(|| format!("failed to write into {}", prefix.display()))?;
    Ok(tool)
}

/// Builds `rule.js` through an entry module of ebb's (`.ebb-build/entry.js`) that gives the
/// rule a `console` over its stdout and stderr, and turns a fractional or out-of-range number
/// from a decision into an error naming the export and the value.
fn build_js(folder: &Path, name: &str) -> Result<PathBuf> {
    if !folder.join("rule.js").is_file() {
        bail!("{} has no rule.js: the rule's module (see `ebb rule new NAME --lang js`)", folder.display());
    }
    let tool = componentize_qjs()?;
    let build = build_dir(folder)?;
    for (relative, text) in [
        ("console.js", JS_CONSOLE),
        ("entry.js", JS_ENTRY),
        ("wit/world.wit", JS_WORLD),
        ("wit/deps/io/io.wit", WASI_IO),
        ("wit/deps/cli/cli.wit", WASI_CLI),
        ("wit/deps/ebb-rules/rules.wit", super::new::SCRIPT_CONTRACT_WIT),
    ] {
        let path = build.join(relative);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("failed to create folder {}", dir.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("failed to write {}", path.display()))?;
    }
    let staged = Path::new(BUILD_DIR).join(format!("{name}.wasm"));
    run_tool(
        Command::new(&tool)
            .current_dir(folder)
            .args(["-w", ".ebb-build/wit", "-n", "scaling-rule-with-console", "--sync", "-j", ".ebb-build/entry.js", "--module-root", ".", "-o"])
            .arg(&staged),
        "componentize-qjs",
        NODE_HINT,
    )?;
    put_in_place(&folder.join(staged), folder, name)
}
