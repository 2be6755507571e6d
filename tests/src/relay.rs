//! A TCP relay from a loopback port to another address, which a test can
//! cut and mend: the network between a client and its server failing.
//! A cut closes every connection through the relay and closes each new
//! one at once (a reset, as a restarted router or a lost route gives),
//! until mended. A cut that drops packets silently is not this one: a
//! client notices that only by its own timeouts.
//!
//! The relay runs on a thread of its own, so that it relays while the
//! test's thread blocks (kubectl, a blocking HTTP call).

use std::net::SocketAddr;
use std::thread::JoinHandle;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    /// Where clients connect: `127.0.0.1:PORT`, chosen at run time.
    pub addr: SocketAddr,
    /// `true` while cut; dropped, the relay stops.
    cut: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    /// A relay to `target`, relaying.
    pub fn start(target: SocketAddr) -> Relay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the relay's address");
        let (cut, cut_rx) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the relay");
                runtime.block_on(relay(listener, target, cut_rx));
            })
            .expect("a thread for the relay");
        Relay {
            addr,
            cut: Some(cut),
            thread: Some(thread),
        }
    }

    /// Close every connection through the relay, and each new one, until
    /// [`Self::mend`].
    pub fn cut(&self) {
        if let Some(c) = &self.cut {
            c.send_replace(true);
        }
    }

    /// Relay again.
    pub fn mend(&self) {
        if let Some(c) = &self.cut {
            c.send_replace(false);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        drop(self.cut.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Accept and relay until the sender of `cut` is gone.
async fn relay(listener: std::net::TcpListener, target: SocketAddr, cut: watch::Receiver<bool>) {
    let listener = TcpListener::from_std(listener).expect("a tokio listener");
    let mut gone = cut.clone();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            // The sender is dropped only with the Relay.
            changed = gone.changed() => match changed {
                Ok(()) => continue,
                Err(_) => return,
            },
        };
        let Ok((mut inbound, _)) = accepted else {
            continue;
        };
        if *cut.borrow() {
            continue; // closed at once: the network is cut
        }
        let mut cut = cut.clone();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(target).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                // Cut (or the relay gone): both sides closed.
                _ = cut.wait_for(|cut| *cut) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// An echo server on loopback; its address.
    fn echo() -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn round_trip(s: &mut std::net::TcpStream) -> std::io::Result<Vec<u8>> {
        s.write_all(b"ping")?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf)?;
        Ok(buf.to_vec())
    }

    #[test]
    fn a_cut_closes_what_goes_through_and_a_mend_lets_it_through_again() {
        let relay = Relay::start(echo());
        let mut before = std::net::TcpStream::connect(relay.addr).unwrap();
        assert_eq!(round_trip(&mut before).unwrap(), b"ping");

        relay.cut();
        // The open connection is closed (as soon as the relay's thread
        // runs); a new one is closed at once.
        crate::eventually::until_blocking(
            "the open connection closed",
            crate::eventually::PATIENCE,
            || round_trip(&mut before).is_err(),
        );
        let mut during = std::net::TcpStream::connect(relay.addr).unwrap();
        assert!(round_trip(&mut during).is_err(), "relayed through a cut");

        relay.mend();
        crate::eventually::until_blocking("a relay mended", crate::eventually::PATIENCE, || {
            std::net::TcpStream::connect(relay.addr)
                .and_then(|mut s| round_trip(&mut s))
                .is_ok()
        });
    }
}
