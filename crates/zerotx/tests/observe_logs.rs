//! The log events (feature `tracing`): each decision an operator asks about, made on the real
//! kernel, shows up as its event, with the socket's peer, once per decision: the events' `count`
//! adds up to the sender's counter in `Stats`. A capturing subscriber made for tests
//! (tracing-subscriber's registry with a layer that keeps every event) reads them.

mod util;

use std::collections::HashMap;
use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use util::{tcp_pair, Peer};
use zerotx::{BufPool, EngineKind, SendError, Sender, SenderConfig};

/// One event as the subscriber saw it.
#[derive(Debug, Clone)]
struct Ev {
    level: tracing::Level,
    message: String,
    fields: HashMap<String, String>,
}

impl Ev {
    fn field(&self, name: &str) -> &str {
        self.fields
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("no field {name} in {self:?}"))
    }

    fn count(&self) -> u64 {
        self.field("count").parse().unwrap()
    }
}

/// Keeps every event of target `zerotx`.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Ev>>>);

struct Fields<'a>(&'a mut Ev);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}");
        if field.name() == "message" {
            self.0.message = v;
        } else {
            self.0.fields.insert(field.name().to_string(), v);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .fields
            .insert(field.name().to_string(), value.to_string());
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "zerotx" {
            return;
        }
        let mut ev = Ev {
            level: *event.metadata().level(),
            message: String::new(),
            fields: HashMap::new(),
        };
        event.record(&mut Fields(&mut ev));
        self.0.lock().unwrap().push(ev);
    }
}

/// Runs `f` with the capturing subscriber as this thread's default, and returns what it logged.
fn captured<T>(f: impl FnOnce() -> T) -> (T, Vec<Ev>) {
    let cap = Capture::default();
    let sub = tracing_subscriber::registry().with(cap.clone());
    let out = tracing::subscriber::with_default(sub, f);
    let evs = cap.0.lock().unwrap().clone();
    (out, evs)
}

/// The events with `message`.
fn named<'a>(evs: &'a [Ev], message: &str) -> Vec<&'a Ev> {
    evs.iter().filter(|e| e.message == message).collect()
}

/// The sum of `count` over the events with `message`.
fn counted(evs: &[Ev], message: &str) -> u64 {
    named(evs, message).iter().map(|e| e.count()).sum()
}

#[test]
fn a_new_sender_says_once_which_engine_it_runs_and_why_with_its_peer() {
    let (client, peer) = tcp_pair(false, Peer::default());
    let addr = client.peer_addr().unwrap().to_string();
    let (_, evs) = captured(|| {
        let mut tx = Sender::new(client, EngineKind::Auto).unwrap();
        tx.send(vec![1u8; 4096]).unwrap();
        tx.flush(Duration::from_secs(5)).unwrap();
        drop(tx.close(Duration::from_secs(5)));
    });
    peer.join().unwrap();
    let chosen = named(&evs, "engine chosen");
    assert_eq!(chosen.len(), 1, "{evs:#?}");
    let e = chosen[0];
    assert_eq!(e.level, tracing::Level::INFO);
    assert_eq!(e.field("peer"), addr);
    assert_eq!(e.field("engine"), "auto");
    assert_eq!(e.field("zerocopy"), "false");
    assert!(e.field("reasons").contains("loopback"), "{e:?}");
    // Nothing went wrong, and no send logged anything.
    assert_eq!(evs.len(), 1, "{evs:#?}");
}

/// `auto` on one unconnected UDP socket: to a local peer (the kernel copies: a switch to copy),
/// then into the black hole (a probe pays: zero-copy back). One event per decision.
#[test]
fn auto_switching_to_copy_and_back_is_logged_once_per_switch() {
    util::in_black_hole(65535, |bh| {
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        util::set_int_opt(
            sink.as_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            8 << 20,
        );
        let local = sink.local_addr().unwrap();
        let cfg = SenderConfig::new(EngineKind::Auto).with_auto_uring(false);
        let (stats, evs) = captured(|| {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            let mut tx: Sender<Vec<u8>> = Sender::with_config(sock, cfg).unwrap();
            let mut out = Vec::new();
            let mut buf = vec![0u8; 65536];
            for i in 0..200 {
                tx.send_to(vec![i as u8; 16 * 1024], local).unwrap();
                if i % 8 == 0 {
                    tx.flush(Duration::from_secs(5)).unwrap();
                    sink.set_nonblocking(true).unwrap();
                    while sink.recv(&mut buf).is_ok() {}
                }
                tx.reap(&mut out).unwrap();
            }
            assert!(tx.stats().switches_to_copy >= 1, "{:?}", tx.stats());
            for i in 0..6000 {
                tx.send_to(vec![i as u8; 16 * 1024], bh.v4).unwrap();
                tx.reap(&mut out).unwrap();
                out.clear();
                if tx.stats().probes_paid > 0 {
                    break;
                }
            }
            tx.flush(Duration::from_secs(5)).unwrap();
            tx.reap(&mut out).unwrap();
            let stats = tx.stats();
            drop(tx.close(Duration::from_secs(5)));
            stats
        });
        assert!(
            stats.switches_to_copy >= 1 && stats.probes_paid >= 1,
            "{stats:?}"
        );
        assert_eq!(
            counted(&evs, "auto switched to copying"),
            stats.switches_to_copy
        );
        assert_eq!(
            counted(&evs, "auto probe paid: back to zero-copy"),
            stats.probes_paid
        );
        for e in named(&evs, "auto switched to copying") {
            assert!(e.field("peer").starts_with("unconnected"), "{e:?}");
        }
    });
}

/// Option memory lowered in the test's own namespace: the kernel refuses `MSG_ZEROCOPY`; each
/// refusal and each copy after it (a fallback, or `auto`'s hold) is in the log.
#[test]
fn budget_refusals_and_holds_are_logged_as_they_are_counted() {
    util::in_black_hole(65535, |bh| {
        let default = zerotx_testbed::optmem_max().unwrap();
        let (stats, evs) = captured(|| {
            zerotx_testbed::set_optmem_max(16).unwrap();
            let mut tx = Sender::connect_udp(bh.v4, EngineKind::MsgZerocopy).unwrap();
            for _ in 0..50 {
                tx.send(vec![3u8; 16000]).unwrap();
            }
            let (_, stats) = util::finish(tx);
            stats
        });
        zerotx_testbed::set_optmem_max(default).unwrap();
        assert!(stats.enobufs >= 50 && stats.fallbacks == 50, "{stats:?}");
        assert_eq!(counted(&evs, "zero-copy budget refused"), stats.enobufs);
        assert_eq!(
            counted(&evs, "sent by copy after the budget refused (fallback)"),
            stats.fallbacks
        );
        let refused = named(&evs, "zero-copy budget refused");
        assert_eq!(refused[0].field("peer"), bh.v4.to_string());
        assert_eq!(refused[0].level, tracing::Level::WARN);

        // `auto`: lowered after the sender exists, so its cap does not foresee it: refusals,
        // then holds (copies for the budget).
        let (stats, evs) = captured(|| {
            let mut tx = Sender::with_config(
                util::connected_udp(bh.v4),
                SenderConfig::new(EngineKind::Auto).with_auto_uring(false),
            )
            .unwrap();
            zerotx_testbed::set_optmem_max(1024).unwrap();
            let mut out = Vec::new();
            for i in 0..2000 {
                tx.send(vec![i as u8; 16 * 1024]).unwrap();
                if i % 64 == 0 {
                    tx.reap(&mut out).unwrap();
                }
            }
            let (_, stats) = util::finish(tx);
            stats
        });
        zerotx_testbed::set_optmem_max(default).unwrap();
        assert!(stats.enobufs > 0 && stats.copied_budget > 0, "{stats:?}");
        assert_eq!(counted(&evs, "zero-copy budget refused"), stats.enobufs);
        assert_eq!(
            counted(&evs, "auto copied for the budget (hold or cap)"),
            stats.copied_budget
        );
        let refused = named(&evs, "zero-copy budget refused");
        assert!(refused[0].field("then").contains("hold"), "{refused:?}");
    });
}

/// A peer that never reads: `close` at once keeps what the kernel still holds, and says so.
#[test]
fn close_with_buffers_kept_is_logged_with_how_many() {
    let (client, _server) = util::stalled_peer();
    let addr = client.peer_addr().unwrap().to_string();
    let (kept, evs) = captured(|| {
        let mut tx = Sender::new(client, EngineKind::MsgZerocopy).unwrap();
        for _ in 0..64 {
            match tx.try_send(vec![5u8; 64 * 1024]) {
                Ok(()) => {}
                Err(SendError::WouldBlock(_)) => break,
                Err(e) => panic!("{e}"),
            }
        }
        tx.close(Duration::ZERO).kept
    });
    assert!(kept > 0, "nothing kept");
    let closed = named(&evs, "closed with buffers kept");
    assert_eq!(closed.len(), 1, "{evs:#?}");
    assert_eq!(closed[0].field("kept"), kept.to_string());
    assert_eq!(closed[0].field("peer"), addr);
}

/// A peer that resets part way: the buffer it cut short is logged, with the error.
#[test]
fn a_stream_cut_short_is_logged_with_its_error() {
    let (client, reader) = util::resetting_client();
    let (stats, evs) = captured(|| {
        let mut tx = Sender::new(client, EngineKind::Copy).unwrap();
        tx.send(vec![9u8; 1 << 20]).unwrap();
        // The usual loop's shape: the flush finds the buffer cut short (before any reap).
        assert!(tx.flush(Duration::from_secs(10)).is_err());
        let stats = tx.stats();
        drop(tx.close(Duration::from_secs(5)));
        stats
    });
    reader.join().unwrap();
    assert_eq!(stats.errors, 1, "{stats:?}");
    let cut = named(&evs, "stream cut short");
    assert_eq!(cut.len(), 1, "{evs:#?}");
    assert_eq!(cut[0].count(), 1);
    assert!(cut[0].field("error").contains("os error"), "{cut:?}");
}

/// Completions the ledger refuses: a socket whose `MSG_ZEROCOPY` id counter stands at 0 while the
/// sender was told it stands at 1000 (`with_zerocopy_first_id`): every completion is out of the
/// window, refused, and logged.
#[test]
fn refused_completions_are_logged() {
    util::in_black_hole(65535, |bh| {
        let sock = util::connected_udp(bh.v4);
        util::set_int_opt(sock.as_fd(), libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1);
        let cfg = SenderConfig::new(EngineKind::MsgZerocopy).with_zerocopy_first_id(1000);
        let (stats, evs) = captured(|| {
            let mut tx = Sender::with_config(sock, cfg).unwrap();
            for _ in 0..4 {
                tx.send(vec![1u8; 1000]).unwrap();
            }
            let mut out = Vec::new();
            for _ in 0..100 {
                tx.reap(&mut out).unwrap();
                if tx.stats().bad_completions > 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let stats = tx.stats();
            drop(tx.close(Duration::ZERO));
            stats
        });
        assert!(stats.bad_completions > 0, "{stats:?}");
        assert_eq!(counted(&evs, "completion refused"), stats.bad_completions);
        assert_eq!(named(&evs, "closed with buffers kept").len(), 1, "{evs:#?}");
    });
}

/// `auto` on `sendmsg(2)` offered a pool to register, and io_uring refused (a seccomp filter on
/// this thread, as a container's profile has): both are logged.
#[test]
fn io_uring_refused_and_a_pool_not_registered_are_logged() {
    std::thread::spawn(|| {
        util::refuse_io_uring(libc::EPERM as u32);
        let (client, peer) = tcp_pair(false, Peer::default());
        let (_, evs) = captured(|| {
            let mut tx: Sender<Vec<u8>> = Sender::new(client, EngineKind::Auto).unwrap();
            let pool = BufPool::new(4096, 4).unwrap();
            tx.register_pool(&pool).unwrap();
            drop(tx.close(Duration::from_secs(5)));
        });
        peer.join().unwrap();
        let refused = named(&evs, "io_uring refused, using sendmsg(2)");
        assert_eq!(refused.len(), 1, "{evs:#?}");
        assert_eq!(refused[0].level, tracing::Level::WARN);
        assert!(!refused[0].field("reason").is_empty());
        let pool = named(&evs, "pool offered and not registered");
        assert_eq!(pool.len(), 1, "{evs:#?}");
        assert!(pool[0].field("reason").contains("sendmsg"), "{pool:?}");
    })
    .join()
    .unwrap();
}
