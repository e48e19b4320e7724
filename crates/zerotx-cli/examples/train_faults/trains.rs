//! A sender of trains that counts every train's report once and overwrites each buffer the
//! instant it comes back.

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use zerotx::{SendError, SendPath, Sender, SenderConfig, Stats};

use super::datagrams::{connected, receiver, say_done, train, word, SEG};

/// What a sender's trains came to: each train's report by its number, the trains refused at
/// the call with their errno, and the final counters.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) reports: BTreeMap<u32, (SendPath, usize)>,
    pub(crate) refused: BTreeMap<u32, i32>,
    pub(crate) stats: Stats,
}

impl Tally {
    pub(crate) fn paths(&self) -> impl Iterator<Item = SendPath> + '_ {
        self.reports.values().map(|(p, _)| *p)
    }

    pub(crate) fn zero_copy(&self) -> usize {
        self.paths().filter(|p| *p == SendPath::ZeroCopy).count()
    }
}

/// A sender of trains that overwrites every buffer the instant it comes back and counts each
/// train's report once.
pub(crate) struct Trains {
    pub(crate) tx: Sender<Vec<u8>>,
    tally: Tally,
    out: Vec<zerotx::Released<Vec<u8>>>,
}

/// A train refused as not built by an engine that may lack trains.
pub(crate) struct NotBuilt(pub(crate) String);

impl Trains {
    pub(crate) fn new(sock: UdpSocket, cfg: SenderConfig) -> Self {
        Self::from(Sender::with_config(sock, cfg).unwrap_or_else(|e| panic!("the sender: {e}")))
    }

    pub(crate) fn from(tx: Sender<Vec<u8>>) -> Self {
        Trains {
            tx,
            tally: Tally::default(),
            out: Vec::new(),
        }
    }

    /// Sends train `t` (to `dest` if given); a refusal at the call is counted with its errno
    /// after checking the buffer came back unchanged. `Invalid` is returned as it is.
    pub(crate) fn send(
        &mut self,
        t: u32,
        buf: Vec<u8>,
        segment: usize,
        dest: Option<SocketAddr>,
    ) -> Result<(), SendError<Vec<u8>>> {
        let copy = buf.clone();
        let sent = match dest {
            Some(dest) => self.tx.send_train_to(buf, segment as u16, dest),
            None => self.tx.send_train(buf, segment as u16),
        };
        let result = match sent {
            Ok(()) => Ok(()),
            Err(SendError::Io { buf, error }) => {
                assert!(buf == copy, "train {t} came back changed with {error}");
                let errno = error.raw_os_error().unwrap_or(-1);
                assert!(
                    self.tally.refused.insert(t, errno).is_none(),
                    "train {t} refused twice"
                );
                Ok(())
            }
            Err(e) => Err(e),
        };
        self.reap();
        result
    }

    /// Takes what came back: one report per train, buffers overwritten at once.
    pub(crate) fn reap(&mut self) {
        if let Err(e) = self.tx.reap(&mut self.out) {
            panic!("reap: {e}");
        }
        self.take();
    }

    /// Waits until every buffer is back and takes them. A flush answers an error when buffers
    /// came back with one since the last flush (on io_uring, the kernel's refusal of a train
    /// comes back that way): those are taken as refused, and the flush goes on.
    pub(crate) fn flush(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let flushed = self.tx.flush(left);
            self.reap();
            match flushed {
                Ok(()) => return,
                Err(zerotx::Error::Failed { .. }) if !left.is_zero() => {}
                Err(e) => panic!("flush: {e}; {:?}", self.tx.stats()),
            }
        }
    }

    pub(crate) fn take(&mut self) {
        for mut r in self.out.drain(..) {
            let t = word(&r.buf, 0);
            if let Some(error) = &r.report.error {
                // An io_uring engine takes the train and hands the kernel's refusal back with
                // it: the same refusal the sendmsg family answers from the call.
                let errno = error.raw_os_error().unwrap_or(-1);
                assert!(
                    self.tally.refused.insert(t, errno).is_none(),
                    "train {t} refused twice"
                );
                assert!(
                    !self.tally.reports.contains_key(&t),
                    "train {t} released and refused"
                );
                r.buf.fill(0xEE);
                continue;
            }
            assert_eq!(r.report.bytes, r.buf.len(), "train {t}: bytes reported");
            r.buf.fill(0xEE);
            let before = self.tally.reports.insert(t, (r.report.path, r.buf.len()));
            assert!(before.is_none(), "train {t} came back twice");
            assert!(
                !self.tally.refused.contains_key(&t),
                "train {t} refused and released"
            );
        }
    }

    /// Waits for every buffer, closes, and checks that nothing was kept or refused by the
    /// ledger.
    pub(crate) fn finish(mut self) -> Tally {
        self.flush();
        self.tally.stats = self.tx.stats();
        let stats = &self.tally.stats;
        assert_eq!(stats.bad_completions, 0, "the ledger refused completions");
        assert_eq!(
            stats.zerocopy_ids, stats.zerocopy_ids_completed,
            "ids taken and completed differ: {stats:?}"
        );
        let Trains { tx, tally, out } = self;
        let closed = tx.close(Duration::from_secs(1));
        assert_eq!(closed.kept, 0, "buffers kept at close");
        assert!(
            out.is_empty() && closed.released.is_empty(),
            "buffers back after the flush"
        );
        tally
    }
}

/// Sends trains `0..n` of `count` x [`SEG`] (the last `last` bytes) to `dest`, then says done.
pub(crate) fn send_all(
    cfg: SenderConfig,
    sock: UdpSocket,
    n: u32,
    count: usize,
    last: usize,
) -> Tally {
    let dest = sock.peer_addr().expect("a connected socket");
    let mut tx = Trains::new(sock, cfg);
    for t in 0..n {
        if let Err(e) = tx.send(t, train(t, SEG, count, last), SEG, None) {
            panic!("train {t}: {e}");
        }
    }
    let tally = tx.finish();
    say_done(dest, libc::IPPROTO_UDP);
    tally
}

/// Whether the engine sends trains: a train to a local socket, refused with `Invalid` where it
/// does not (the io_uring engines until they take trains).
pub(crate) fn takes_trains(cfg: SenderConfig) -> Result<(), NotBuilt> {
    zerotx_testbed::in_new_netns(move || {
        let rx = receiver(
            "127.0.0.1:0".parse().expect("an address"),
            libc::IPPROTO_UDP,
        )
        .expect("a receiver");
        let sock = connected(rx.local_addr().expect("bound"), libc::IPPROTO_UDP).expect("a socket");
        let mut tx = Trains::new(sock, cfg);
        match tx.send(0, train(0, 1000, 3, 1000), 1000, None) {
            Ok(()) => {
                tx.finish();
                Ok(())
            }
            Err(SendError::Invalid { reason, .. }) => Err(NotBuilt(reason.to_owned())),
            Err(e) => panic!("a train to a local socket: {e}"),
        }
    })
    .unwrap_or_else(|e| panic!("a namespace: {e}"))
}
