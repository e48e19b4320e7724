//! `Sender::tcp_info`: the kernel's view of a sender's TCP connection (`TCP_INFO`). Retransmits
//! are made on demand: nftables drops one in ten of the data segments arriving on loopback, in
//! a namespace the test made (the input hook: a real loss, which TCP retransmits; a drop in the
//! output hook is a local send error, which TCP sends again without counting a retransmit).

mod util;

use std::time::Duration;

use util::{tcp_pair, Peer, MIB};
use zerotx::{EngineKind, Sender};

#[test]
fn a_tcp_sender_reports_its_window_and_rtt_and_a_udp_sender_says_it_has_none() {
    let (client, peer) = tcp_pair(false, Peer::default());
    let mut tx = Sender::new(client, EngineKind::Auto).unwrap();
    for _ in 0..16 {
        tx.send(vec![1u8; 256 << 10]).unwrap();
    }
    tx.flush(Duration::from_secs(10)).unwrap();
    let info = tx.tcp_info().unwrap();
    assert!(info.cwnd > 0 && info.mss > 0, "{info:?}");
    assert_eq!(
        info.cwnd_bytes(),
        u64::from(info.cwnd) * u64::from(info.mss)
    );
    assert!(info.rtt > Duration::ZERO, "{info:?}");
    drop(tx.close(Duration::from_secs(5)));
    assert_eq!(peer.join().unwrap().bytes, 4 * MIB);

    let udp = util::connected_udp("127.0.0.1:9".parse().unwrap());
    let tx: Sender<Vec<u8>> = Sender::new(udp, EngineKind::Copy).unwrap();
    let err = tx.tcp_info().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("only on TCP"), "{err}");
}

#[test]
fn retransmits_after_drops_show_in_tcp_info() {
    util::require!(
        util::is_root(),
        "needs root for a private network namespace"
    );
    zerotx_testbed::in_new_netns(|| {
        let (client, peer) = tcp_pair(false, Peer::checking());
        let port = client.peer_addr().unwrap().port();
        let rules = format!(
            "table inet zerotx_drop {{\n chain inp {{\n type filter hook input priority 0;\n \
             tcp dport {port} meta length > 1000 numgen random mod 10 == 0 drop\n }}\n}}\n"
        );
        if !util::run_tool("nft", &["-f", "-"], Some(&rules)) {
            return;
        }
        let mut tx = Sender::new(client, EngineKind::Copy).unwrap();
        for i in 0..64u64 {
            let mut buf = vec![0u8; 128 << 10];
            util::fill(&mut buf, i * (128 << 10));
            tx.send(buf).unwrap();
        }
        tx.flush(Duration::from_secs(20)).unwrap();
        // Read once every segment was acknowledged: a dropped one only after its retransmit.
        let mut info = tx.tcp_info().unwrap();
        for _ in 0..1000 {
            if info.unacked == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            info = tx.tcp_info().unwrap();
        }
        drop(tx.close(Duration::from_secs(20)));
        let got = peer.join().unwrap();
        assert_eq!((got.bytes, got.mismatches), (8 * MIB, 0));
        assert!(info.retransmits > 0, "1 in 10 segments dropped: {info:?}");
    })
    .unwrap();
}
