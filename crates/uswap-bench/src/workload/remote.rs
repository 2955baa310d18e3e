//! The NBD server the remote backends swap to (`uswap-nbd`,
//! `uswap-zram-nbd`): nbdkit, started by the bench for each run on a Unix
//! socket of its own and killed after it, so that no run inherits another
//! one's export.  Its memory plugin stands for another machine's memory
//! (it holds what it is sent, outside the run's budget, as a remote
//! machine's memory would be); its file plugin for another machine's
//! disk.  A delay filter adds a network's round trip to every read and
//! write.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// What the server keeps pages in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum NbdPlugin {
    /// nbdkit's memory plugin: another machine's RAM.
    Memory,
    /// nbdkit's file plugin on a file in --swap-dir: another machine's disk.
    File,
}

/// A running nbdkit, killed and its file removed when dropped.
pub struct NbdServer {
    child: Child,
    file: Option<PathBuf>,
    sock: PathBuf,
    uri: String,
}

impl NbdServer {
    /// nbdkit serving `bytes` with `plugin`, each read and write delayed
    /// by `delay_ms` (none at 0), on a socket in `dir` (the file plugin's
    /// file too).
    pub fn start(plugin: NbdPlugin, bytes: u64, delay_ms: f64, dir: &Path) -> Result<NbdServer> {
        let sock = dir.join(format!("nbd-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&sock);
        let mut cmd = Command::new("nbdkit");
        cmd.args(["--foreground", "--exit-with-parent", "--unix"])
            .arg(&sock);
        if delay_ms > 0.0 {
            cmd.arg("--filter=delay");
        }
        let file = match plugin {
            NbdPlugin::Memory => {
                cmd.args(["memory", &bytes.to_string()]);
                None
            }
            NbdPlugin::File => {
                let f = dir.join(format!("nbd-{}.img", std::process::id()));
                std::fs::File::create(&f)
                    .and_then(|h| h.set_len(bytes))
                    .with_context(|| format!("creating the NBD server's file {}", f.display()))?;
                cmd.arg("file").arg(&f);
                Some(f)
            }
        };
        if delay_ms > 0.0 {
            cmd.arg(format!("rdelay={delay_ms}ms"))
                .arg(format!("wdelay={delay_ms}ms"));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting nbdkit for the remote backends: install it (apt-get install nbdkit)")?;
        let mut server = NbdServer {
            child,
            file,
            uri: format!("nbd+unix:///?socket={}", sock.display()),
            sock: sock.clone(),
        };
        let start = Instant::now();
        // Listening, not only bound (a connect between the two is refused).
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            if let Some(status) = server.child.try_wait()? {
                bail!("nbdkit ended at start ({status}): see its message above");
            }
            if start.elapsed() > Duration::from_secs(10) {
                bail!("nbdkit made no socket in 10 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(server)
    }

    /// The export's URI, for a swap spec.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Its Unix socket.
    pub fn socket(&self) -> &Path {
        &self.sock
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(f) = &self.file {
            let _ = std::fs::remove_file(f);
        }
    }
}
