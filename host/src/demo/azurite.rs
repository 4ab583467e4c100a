//! Azure's emulator for `ebb demo --backend azurite`: installed from npm, pinned by the
//! same `package-lock.json` the tests use (kept in the binary, so an installed `ebb` needs
//! no checkout), into a cache folder named by the lock's hash; started on a free port,
//! stopped on drop.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

const PACKAGE_JSON: &str = include_str!("../../../tests/azurite/package.json");
const PACKAGE_LOCK: &str = include_str!("../../../tests/azurite/package-lock.json");

pub(super) struct Azurite {
    child: std::process::Child,
    pub(super) endpoint: String,
}

impl Azurite {
    pub(super) fn start() -> Result<Azurite> {
        let tool = install()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(&tool)
            .args(["--queueHost", "127.0.0.1", "--queuePort", &port.to_string(), "--inMemoryPersistence", "--disableTelemetry", "--silent"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("failed to start {} (needs Node.js 20+)", tool.display()))?;
        let mut azurite = Azurite { child, endpoint: format!("http://127.0.0.1:{port}/{}", crate::queue::azure::DEVELOPMENT_ACCOUNT) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = azurite.child.try_wait()? {
                bail!("Azurite exited ({status}) before answering on port {port}");
            }
            if Instant::now() > deadline {
                bail!("Azurite did not answer on port {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(azurite)
    }

    pub(super) fn account(&self) -> Result<crate::queue::azure::AzureAccount> {
        crate::queue::azure::AzureAccount::with_key(crate::queue::azure::DEVELOPMENT_ACCOUNT, crate::queue::azure::DEVELOPMENT_KEY, Some(&self.endpoint))
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Installs the pinned Azurite once per lock (`npm ci`) and returns its `azurite-queue`.
fn install() -> Result<PathBuf> {
    let prefix = cache_dir().join(format!("azurite-{}", &super::sha256(PACKAGE_LOCK.as_bytes())[..16]));
    let tool = prefix.join("node_modules/.bin/azurite-queue");
    if tool.exists() {
        return Ok(tool);
    }
    println!("installing Azurite from npm into {} (npm ci)", prefix.display());
    std::fs::create_dir_all(&prefix).with_context(|| format!("failed to create {}", prefix.display()))?;
    for (file, text) in [("package.json", PACKAGE_JSON), ("package-lock.json", PACKAGE_LOCK)] {
        std::fs::write(prefix.join(file), text).with_context(|| format!("failed to write {}", prefix.join(file).display()))?;
    }
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--silent", "--prefix"])
        .arg(&prefix)
        .status()
        .context("--backend azurite needs Node.js 20+ and npm: failed to run npm")?;
    if !status.success() {
        bail!("npm ci of Azurite into {} failed ({status})", prefix.display());
    }
    Ok(tool)
}

/// `$XDG_CACHE_HOME/ebb`, else `~/.cache/ebb`, else the system's temporary folder.
fn cache_dir() -> PathBuf {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    non_empty("XDG_CACHE_HOME").or_else(|| non_empty("HOME").map(|home| home.join(".cache"))).unwrap_or_else(std::env::temp_dir).join("ebb")
}
