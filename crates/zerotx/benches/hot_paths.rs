//! Criterion micro-benchmarks of the pure hot paths: the completion ledger and the error-queue
//! decoder. (End-to-end copy vs zero-copy figures come from `zerotx bench`.)

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use zerotx::internals::cmsg::{self, CmsgBuilder, ZcRange, IPV6_RECVERR, IP_RECVERR};
use zerotx::internals::ledger::Ledger;

fn ledger(c: &mut Criterion) {
    let mut g = c.benchmark_group("ledger");
    for &(name, coalesce) in &[("one completion per id", 1u32), ("ranges of 64", 64)] {
        g.throughput(Throughput::Elements(4096));
        g.bench_function(name, |b| {
            b.iter_batched(
                || Ledger::<u64>::new(u32::MAX - 2048),
                |mut l| {
                    let mut out = Vec::with_capacity(4096);
                    let start = l.next_id();
                    for i in 0..4096u64 {
                        let s = l.insert(i);
                        l.record_id(s);
                        l.seal(s);
                    }
                    let mut lo = start;
                    for _ in 0..4096 / coalesce {
                        let hi = lo.wrapping_add(coalesce - 1);
                        l.complete(
                            ZcRange {
                                lo,
                                hi,
                                copied: false,
                            },
                            &mut out,
                        )
                        .unwrap();
                        lo = hi.wrapping_add(1);
                    }
                    black_box(out.len())
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let one = CmsgBuilder::new().zerocopy(IP_RECVERR, 7, 9, true).build();
    let mixed = CmsgBuilder::new()
        .raw(libc::SOL_SOCKET, libc::SCM_TIMESTAMPING, &[0u8; 48])
        .zerocopy(IPV6_RECVERR, u32::MAX - 1, 3, false)
        .zerocopy(IP_RECVERR, 4, 100, false)
        .build();
    let mut g = c.benchmark_group("cmsg decode");
    for (name, buf) in [("one completion", &one), ("three messages", &mixed)] {
        g.bench_function(name, |b| {
            let mut out = Vec::with_capacity(4);
            b.iter(|| {
                out.clear();
                cmsg::decode(black_box(buf), &mut out).unwrap();
                black_box(out.len())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, ledger, decode);
criterion_main!(benches);
