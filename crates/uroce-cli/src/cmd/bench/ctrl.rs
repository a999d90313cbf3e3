//! The TCP control channel between bench client and server: one JSON object
//! per line, strictly request / reply, so neither side ever reads ahead of
//! the message it expects (a watcher thread can take over the socket for
//! the one `end` message of a phase).

use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Longest control message accepted.
const MAX_LINE: usize = 1 << 20;

pub struct Ctrl {
    s: TcpStream,
}

impl Ctrl {
    /// `timeout`: the longest wait for any one message.
    pub fn new(s: TcpStream, timeout: Duration) -> Res<Ctrl> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        Ok(Ctrl { s })
    }

    pub fn send(&mut self, v: &Value) -> Res<()> {
        let mut b = serde_json::to_vec(v)?;
        b.push(b'\n');
        self.s.write_all(&b)?;
        Ok(())
    }

    pub fn recv(&mut self) -> Res<Value> {
        read_line(&mut self.s)
    }

    /// Sends `v` and returns the reply; an `{"error": …}` reply is an error.
    pub fn call(&mut self, v: &Value) -> Res<Value> {
        self.send(v)?;
        let r = self.recv()?;
        if let Some(e) = r.get("error").and_then(Value::as_str) {
            return Err(format!("server: {e}").into());
        }
        Ok(r)
    }

    /// Watches for the next message (the client's `end` of a phase) in a
    /// thread; a closed or broken connection counts as the end too.
    pub fn watch_end(&self) -> Res<Watch> {
        let mut s = self.s.try_clone()?;
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        let handle = std::thread::spawn(move || {
            let r = read_line(&mut s).map_err(|e| e.to_string());
            f.store(true, Ordering::Release);
            r
        });
        Ok(Watch { flag, handle: Some(handle) })
    }
}

fn read_line(s: &mut TcpStream) -> Res<Value> {
    let mut line = Vec::with_capacity(256);
    let mut b = [0u8; 1];
    while line.len() < MAX_LINE {
        match s.read(&mut b) {
            Ok(0) => return Err("control connection closed".into()),
            Ok(_) if b[0] == b'\n' => return Ok(serde_json::from_slice(&line)?),
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("control connection: {e}").into()),
        }
    }
    Err("control message too long".into())
}

/// The end of a phase, seen by a watcher thread.
pub struct Watch {
    flag: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Result<Value, String>>>,
}

impl Watch {
    #[inline]
    pub fn done(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// The message that ended the phase.
    pub fn join(mut self) -> Res<Value> {
        let h = self.handle.take().expect("joined once");
        h.join().map_err(|_| "control watcher panicked")?.map_err(Into::into)
    }
}
