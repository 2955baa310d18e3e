//! Tests' NBD servers: `nbdkit`, started by the test on a Unix socket in
//! a directory of its own, ended with the test (`--exit-with-parent`,
//! and killed when the handle goes).  `scripts/check` installs nbdkit;
//! a test that finds none fails and says how to install it, it never
//! passes without a server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::target::{Endpoint, NbdTarget};

/// A running nbdkit.
pub(crate) struct Server {
    child: Option<Child>,
    args: Vec<String>,
    sock: PathBuf,
    /// A TCP port on 127.0.0.1 instead of the socket, when one was asked.
    port: Option<u16>,
    /// The directory of its socket (and the tests' files).
    pub dir: tempfile::TempDir,
}

impl Server {
    /// `nbdkit ARGS` (a plugin and its parameters, filters first) on a
    /// socket of its own.
    pub fn start(args: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, args)
    }

    /// The same in `dir`, whose files the arguments may name.
    pub fn start_in(dir: tempfile::TempDir, args: &[&str]) -> Server {
        let sock = dir.path().join("nbd.sock");
        let mut s = Server {
            child: None,
            args: args.iter().map(|a| a.to_string()).collect(),
            sock,
            port: None,
            dir,
        };
        s.restart();
        s
    }

    /// `nbdkit ARGS` on a free TCP port of 127.0.0.1.
    pub fn start_tcp(args: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let mut s = Server {
            child: None,
            args: args.iter().map(|a| a.to_string()).collect(),
            sock: dir.path().join("unused.sock"),
            port: Some(port),
            dir,
        };
        s.restart();
        s
    }

    /// Start it again after `kill` (the same socket, arguments, files).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "running already");
        let _ = std::fs::remove_file(&self.sock);
        let mut cmd = Command::new("nbdkit");
        cmd.args(["--foreground", "--exit-with-parent"]);
        match self.port {
            Some(p) => cmd.args(["--ipaddr", "127.0.0.1", "--port", &p.to_string()]),
            None => cmd.arg("--unix").arg(&self.sock),
        };
        let child = cmd
            .args(&self.args)
            .stdin(Stdio::null())
            // Its messages (errors it injects, a client gone) go to a
            // file beside its socket, for a test to read if it fails.
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.path().join("nbdkit.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::inherit()),
            )
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start nbdkit ({e}): the NBD tests need it; install it with `apt-get install nbdkit` (scripts/check does)")
            });
        self.child = Some(child);
        let start = Instant::now();
        // Listening, not only bound: nbdkit makes its socket file at
        // bind(2) and listens after, and a connect between the two is
        // refused (seen under load).  The probe connects and closes
        // before the handshake, which nbdkit takes in its stride.
        let up = |s: &Self| match s.port {
            Some(p) => std::net::TcpStream::connect(("127.0.0.1", p)).is_ok(),
            None => std::os::unix::net::UnixStream::connect(&s.sock).is_ok(),
        };
        while !up(self) {
            assert!(start.elapsed() < Duration::from_secs(10), "nbdkit did not start listening");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kill it (SIGKILL) and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The URI of its export, encrypted or not.
    pub fn target(&self, encrypt: bool) -> NbdTarget {
        NbdTarget {
            endpoint: match self.port {
                Some(port) => Endpoint::Tcp {
                    host: "localhost".into(),
                    port,
                },
                None => Endpoint::Unix {
                    path: self.sock.clone(),
                },
            },
            export: String::new(),
            size: None,
            deadline: None,
            encrypt,
        }
    }

    /// A path in its directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.sock
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The test failed: say what became of the server, and what it
            // said (a server that died under a test looks like a client
            // refused).
            let status = self.child.as_mut().map(|c| c.try_wait());
            let log = std::fs::read_to_string(self.dir.path().join("nbdkit.log")).unwrap_or_default();
            eprintln!("nbdkit {:?}: still running unless Ok(Some(status)): {status:?}\n--- its log\n{log}", self.args);
        }
        self.kill();
    }
}
