//! Buffers without `unsafe` in the caller: a sealed file mapped and sent as `Bytes`, and pool
//! blocks turned into `Bytes` that return to their pool when the last reference goes, on every
//! engine.
#![deny(unsafe_code)]

mod util;

use std::io::Write;

use bytes::Bytes;
use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
use zerotx::{map_sealed, BufPool, Error, Sender};

use util::{fill, finish, tcp_pair, Peer};

/// A memfd named `name` holding `len` pattern bytes, sealed as `seals` says.
fn memfd(name: &str, len: usize, seals: SealFlags) -> std::fs::File {
    let fd =
        memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).expect("memfd_create");
    let mut file = std::fs::File::from(fd);
    let mut data = vec![0u8; len];
    fill(&mut data, 0);
    file.write_all(&data).unwrap();
    if !seals.is_empty() {
        fcntl_add_seals(&file, seals).expect("F_ADD_SEALS");
    }
    file
}

/// A mapped, sealed file goes out whole through a `Sender<Bytes>`, as slices of the mapping, and
/// every byte arrives in order; once every send came back, dropping the `Bytes` unmaps the file
/// (no slice is held anywhere else).
#[test]
fn a_sealed_file_sends_as_bytes() {
    const LEN: usize = (4 << 20) + 123;
    const SLICE: usize = 256 << 10;
    for &kind in util::engines() {
        let name = format!("zerotx-sealed-{kind}");
        let file = memfd(
            &name,
            LEN,
            SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW,
        );
        let mapped = || {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .contains(&format!("/memfd:{name} "))
        };
        let body = map_sealed(&file).expect("map_sealed");
        assert_eq!(body.len(), LEN);
        let (client, reader) = tcp_pair(false, Peer::checking());
        let mut tx: Sender<Bytes> = Sender::new(client, kind).expect("sender");
        let mut at = 0;
        while at < LEN {
            let end = LEN.min(at + SLICE);
            tx.send(body.slice(at..end)).expect("send");
            at = end;
        }
        let (released, _) = finish(tx);
        assert_eq!(released.len(), LEN.div_ceil(SLICE), "{kind}");
        for r in &released {
            assert!(r.report.error.is_none(), "{kind}: {:?}", r.report.error);
        }
        drop(released);
        assert!(mapped(), "{kind}: the file is mapped while the Bytes lives");
        drop((body, file));
        assert!(!mapped(), "{kind}: a slice of the mapping is still held");
        let got = reader.join().unwrap();
        assert_eq!(got.bytes, LEN as u64, "{kind}");
        assert_eq!(got.mismatches, 0, "{kind}: {:?}", got.first_mismatch);
    }
}

/// A file that anyone may still write or shrink is refused, with what to do instead.
#[test]
fn an_unsealed_file_is_refused() {
    for seals in [SealFlags::empty(), SealFlags::SHRINK, SealFlags::WRITE] {
        let file = memfd("zerotx-unsealed", 4096, seals);
        match map_sealed(&file) {
            Err(Error::Config { fix, .. }) => assert!(fix.contains("F_SEAL_WRITE"), "{fix}"),
            other => panic!("{seals:?}: {other:?}"),
        }
    }
}

/// Pool blocks turned into `Bytes` (with clones and slices of them held meanwhile) go out
/// through a `Sender<Bytes>`; each block is back in the pool once the sender handed its buffers
/// back and the last clone is dropped, not before.
#[test]
fn pool_blocks_as_bytes_return_to_the_pool() {
    const BLOCKS: usize = 8;
    const BLOCK: usize = 64 << 10;
    for &kind in util::engines() {
        let pool = BufPool::new(BLOCK, BLOCKS).unwrap();
        let (client, reader) = tcp_pair(false, Peer::checking());
        let mut tx: Sender<Bytes> = Sender::new(client, kind).expect("sender");
        let mut kept = Vec::new();
        for i in 0..BLOCKS {
            let mut block = pool.take().expect("a free block");
            fill(&mut block, (i * BLOCK) as u64);
            let bytes = Bytes::from(block.freeze(BLOCK));
            kept.push(bytes.slice(..16));
            tx.send(bytes).expect("send");
        }
        assert_eq!(pool.available(), 0, "{kind}");
        let (released, _) = finish(tx);
        assert_eq!(released.len(), BLOCKS, "{kind}");
        drop(released);
        assert_eq!(
            pool.available(),
            0,
            "{kind}: the slices still hold every block"
        );
        kept.truncate(BLOCKS / 2);
        assert_eq!(pool.available(), BLOCKS / 2, "{kind}");
        drop(kept);
        assert_eq!(
            pool.available(),
            BLOCKS,
            "{kind}: every block back in the pool"
        );
        let got = reader.join().unwrap();
        assert_eq!(got.bytes, (BLOCKS * BLOCK) as u64, "{kind}");
        assert_eq!(got.mismatches, 0, "{kind}: {:?}", got.first_mismatch);
    }
}
