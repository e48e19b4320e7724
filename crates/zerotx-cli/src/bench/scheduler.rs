//! The order of runs, apart from how a run is made (hyperfine keeps its scheduler testable with a
//! mock executor; here the runner is a trait and the tests bring a fake one).
//!
//! - **Interleaved repetitions.** Repetition `r` goes over every size, and at each size over every
//!   engine once, in an order shuffled afresh for each repetition and size (from `--seed`, 0 by
//!   default: the same seed, the same orders; runs compared with each other can alternate
//!   seeds). Drift on a shared machine (another tenant, a warming
//!   cache, thermal limits) then spreads over all engines instead of landing on whichever always
//!   runs first or last, and so does what a run leaves behind for the next: a rotation kept every
//!   engine's neighbour fixed, and `copy` ran right after liburing's example exited (its process
//!   and ring torn down) in every repetition, `raw-copy` after zerotx's `uring-zc-fixed`.
//! - **Paired columns run back to back.** Columns whose ratio is read run by run (an engine and
//!   its baselines, [`Plan::together`]) form a unit: the units' order is shuffled, and so is the
//!   order inside each unit, but a unit's runs are never apart. A run's ratio to its baseline then
//!   compares runs at most a unit's length apart. With the seven columns of compare-raw's UDP
//!   table shuffled freely, a pair was up to six runs (1.2 s) apart, and the host's drift, which
//!   comes in phases of about a second, went into the ratios: the paired interval of `copy` over
//!   TCP at 1 MiB straddled its threshold among four columns and cleared it among two.
//! - **Errors.** A cell whose run failed keeps the runs it had and its first error; its later
//!   repetitions are skipped (reported, not run), and every other cell goes on.

/// One run to make: repetition, size index and engine index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Repetition, from 0.
    pub rep: usize,
    /// Index into the topology's sizes.
    pub size: usize,
    /// Index into the engine columns.
    pub engine: usize,
}

/// How many sizes, engines and repetitions a topology has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Sizes.
    pub sizes: usize,
    /// Engine columns.
    pub engines: usize,
    /// Repetitions per cell.
    pub repeat: usize,
    /// Seed of the order (`--seed`): each repetition and size draws its engines' order from it.
    /// 0 is the default, and always gives the same orders.
    pub seed: u64,
    /// Sets of engine columns that run back to back (see the module docs): disjoint, each of
    /// two or more columns. A column in none runs on its own. Empty: every column on its own,
    /// as before there were sets (the same seed gives the same orders).
    pub together: Vec<Vec<usize>>,
}

impl Plan {
    /// Runs in the plan, skipped ones included.
    pub fn total(&self) -> usize {
        self.sizes * self.engines * self.repeat
    }

    /// The units of [`order`](Self::order): each set of [`together`](Self::together), and every
    /// other column alone, in the order of their lowest column.
    fn units(&self) -> Vec<Vec<usize>> {
        debug_assert!(
            self.together.iter().flatten().all(|&e| e < self.engines),
            "a set names a column beyond {}: {:?}",
            self.engines,
            self.together
        );
        debug_assert!(
            (0..self.engines).all(|e| self.together.iter().filter(|t| t.contains(&e)).count() <= 1),
            "sets overlap: {:?}",
            self.together
        );
        let mut units: Vec<Vec<usize>> = Vec::new();
        for e in 0..self.engines {
            if units.iter().any(|u| u.contains(&e)) {
                continue;
            }
            let mut unit = self
                .together
                .iter()
                .find(|t| t.contains(&e))
                .cloned()
                .unwrap_or_else(|| vec![e]);
            unit.sort_unstable();
            unit.dedup();
            units.push(unit);
        }
        units
    }

    /// Every slot, in the order they run.
    pub fn order(&self) -> impl Iterator<Item = Slot> + '_ {
        let units = self.units();
        (0..self.repeat).flat_map(move |rep| {
            let units = units.clone();
            (0..self.sizes).flat_map(move |size| {
                // SplitMix64's multiplier spreads the seed over the high bits, so seeds 1 and 2
                // are not the plan of seed 0 shifted by a repetition.
                let draw = self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    ^ (rep * self.sizes + size) as u64;
                // The units' order, then each unit's own from a draw of its own (a unit of one
                // draws nothing, so with no sets the order is the columns' shuffle alone).
                let engines: Vec<usize> = shuffled(units.len(), draw)
                    .into_iter()
                    .flat_map(|u| {
                        let unit = &units[u];
                        let inner = draw ^ (u as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03);
                        shuffled(unit.len(), inner).into_iter().map(|i| unit[i])
                    })
                    .collect();
                engines
                    .into_iter()
                    .map(move |engine| Slot { rep, size, engine })
            })
        })
    }
}

/// `0..n` in an order drawn from `seed` (Fisher-Yates over SplitMix64: any permutation can come,
/// and the same seed gives the same one).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed ^ 0x005e_ed0f_2e70_7e55;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// Makes one run of one cell.
pub trait CellRunner {
    /// What a run yields.
    type Run;
    /// Runs `slot`.
    fn run(&mut self, slot: Slot) -> anyhow::Result<Self::Run>;
}

/// What happened to a slot, for progress reports.
#[derive(Debug)]
pub enum Event<'a, T> {
    /// It ran.
    Done(&'a T),
    /// It failed; later repetitions of its cell will be skipped.
    Failed(&'a anyhow::Error),
    /// Not run: an earlier repetition of the cell failed.
    Skipped,
}

/// One cell's runs, and the error that ended it, if one did.
#[derive(Debug, PartialEq)]
pub struct Outcome<T> {
    /// Runs in repetition order.
    pub runs: Vec<T>,
    /// The first error (`{:#}`), after which the cell was not run again.
    pub error: Option<String>,
}

/// Outcomes of every cell of a plan.
#[derive(Debug)]
pub struct Grid<T> {
    engines: usize,
    cells: Vec<Outcome<T>>,
}

impl<T> Grid<T> {
    /// The outcome of (`size`, `engine`), taken out.
    pub fn take(&mut self, size: usize, engine: usize) -> Outcome<T> {
        let cell = &mut self.cells[size * self.engines + engine];
        Outcome {
            runs: std::mem::take(&mut cell.runs),
            error: cell.error.take(),
        }
    }
}

/// Runs `plan` through `runner` in order, telling `observe` about each slot.
pub fn run<R: CellRunner>(
    plan: &Plan,
    runner: &mut R,
    mut observe: impl FnMut(Slot, Event<'_, R::Run>),
) -> Grid<R::Run> {
    let mut cells: Vec<Outcome<R::Run>> = (0..plan.sizes * plan.engines)
        .map(|_| Outcome {
            runs: Vec::new(),
            error: None,
        })
        .collect();
    for slot in plan.order() {
        let cell = &mut cells[slot.size * plan.engines + slot.engine];
        if cell.error.is_some() {
            observe(slot, Event::Skipped);
            continue;
        }
        match runner.run(slot) {
            Ok(run) => {
                observe(slot, Event::Done(&run));
                cell.runs.push(run);
            }
            Err(e) => {
                observe(slot, Event::Failed(&e));
                cell.error = Some(format!("{e:#}"));
            }
        }
    }
    Grid {
        engines: plan.engines,
        cells,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers with the slot itself, or an error for the slots it was told to fail.
    struct FakeRunner {
        fail: Vec<Slot>,
        calls: Vec<Slot>,
    }

    impl CellRunner for FakeRunner {
        type Run = Slot;
        fn run(&mut self, slot: Slot) -> anyhow::Result<Slot> {
            self.calls.push(slot);
            if self.fail.contains(&slot) {
                anyhow::bail!("cell {}x{} broke", slot.size, slot.engine);
            }
            Ok(slot)
        }
    }

    fn slot(rep: usize, size: usize, engine: usize) -> Slot {
        Slot { rep, size, engine }
    }

    #[test]
    fn every_cell_runs_once_per_repetition_in_orders_that_vary() {
        let plan = Plan {
            sizes: 2,
            engines: 3,
            repeat: 3,
            seed: 0,
            together: vec![],
        };
        let order: Vec<Slot> = plan.order().collect();
        assert_eq!(order.len(), plan.total());
        assert_eq!(
            order,
            plan.order().collect::<Vec<_>>(),
            "the same plan, the same order"
        );
        // Grouped by repetition, then size.
        for (i, s) in order.iter().enumerate() {
            assert_eq!((s.rep, s.size), (i / 6, i / 3 % 2), "{i}: {s:?}");
        }
        for rep in 0..3 {
            for size in 0..2 {
                for engine in 0..3 {
                    let n = order
                        .iter()
                        .filter(|s| **s == slot(rep, size, engine))
                        .count();
                    assert_eq!(n, 1, "{rep} {size} {engine}");
                }
            }
        }
    }

    #[test]
    fn another_seed_runs_the_same_slots_in_other_orders() {
        let plan = |seed| Plan {
            sizes: 4,
            engines: 7,
            repeat: 10,
            seed,
            together: vec![],
        };
        let sorted = |mut v: Vec<Slot>| {
            v.sort_by_key(|s| (s.rep, s.size, s.engine));
            v
        };
        let zero: Vec<Slot> = plan(0).order().collect();
        for seed in [1, 2, u64::MAX] {
            let other: Vec<Slot> = plan(seed).order().collect();
            assert_eq!(
                sorted(other.clone()),
                sorted(zero.clone()),
                "seed {seed}: other slots"
            );
            let same = zero
                .chunks(7)
                .zip(other.chunks(7))
                .filter(|(a, b)| a == b)
                .count();
            assert!(
                same < 10,
                "seed {seed}: {same} of 40 groups in seed 0's order"
            );
            assert_eq!(
                other,
                plan(seed).order().collect::<Vec<_>>(),
                "seed {seed} again"
            );
        }
    }

    #[test]
    fn paired_columns_run_back_to_back_in_either_order() {
        // compare-raw's UDP columns: copy, msg-zc, uring-zc-fixed, then their baselines raw-copy,
        // raw-msg-zc, raw-uring-zc-fixed and liburing's example.
        let plan = Plan {
            sizes: 2,
            engines: 7,
            repeat: 60,
            seed: 0,
            together: vec![vec![0, 3], vec![1, 4], vec![2, 5, 6]],
        };
        let order: Vec<Slot> = plan.order().collect();
        assert_eq!(order.len(), plan.total());
        let mut firsts = [0usize; 7];
        let mut unit_firsts = std::collections::BTreeMap::new();
        for chunk in order.chunks(7) {
            let engines: Vec<usize> = chunk.iter().map(|s| s.engine).collect();
            let mut sorted = engines.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..7).collect::<Vec<_>>(), "{engines:?}");
            for set in &plan.together {
                let at: Vec<usize> = set
                    .iter()
                    .map(|e| engines.iter().position(|x| x == e).unwrap())
                    .collect();
                let span = at.iter().max().unwrap() - at.iter().min().unwrap();
                assert_eq!(span, set.len() - 1, "{set:?} apart in {engines:?}");
            }
            firsts[engines[0]] += 1;
            let unit = plan.together.iter().position(|t| t.contains(&engines[0]));
            *unit_firsts.entry(unit).or_insert(0) += 1;
        }
        // Inside a pair either column goes first, and any unit can open the repetition.
        for (e, n) in firsts.iter().enumerate() {
            assert!(*n > 0, "column {e} never ran first: {firsts:?}");
        }
        assert_eq!(unit_firsts.len(), 3, "{unit_firsts:?}");
    }

    #[test]
    fn with_no_sets_the_order_is_the_columns_shuffle_as_before() {
        for seed in [0, 7] {
            let plan = Plan {
                sizes: 3,
                engines: 5,
                repeat: 4,
                seed,
                together: vec![],
            };
            let order: Vec<usize> = plan.order().map(|s| s.engine).collect();
            let before: Vec<usize> = (0..4 * 3)
                .flat_map(|i| shuffled(5, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64))
                .collect();
            assert_eq!(order, before, "seed {seed}");
        }
    }

    #[test]
    fn no_engine_keeps_its_place_or_its_neighbour() {
        // Seven columns (compare-raw's UDP table), 60 repetitions of one size: every engine runs
        // first, and after several different engines.
        let plan = Plan {
            sizes: 1,
            engines: 7,
            repeat: 60,
            seed: 0,
            together: vec![],
        };
        let order: Vec<usize> = plan.order().map(|s| s.engine).collect();
        for e in 0..7 {
            let firsts = order.chunks(7).filter(|c| c[0] == e).count();
            assert!(
                (2..=20).contains(&firsts),
                "engine {e} first {firsts} times of 60"
            );
            let mut before = std::collections::BTreeSet::new();
            for w in order.windows(2).filter(|w| w[1] == e) {
                before.insert(w[0]);
            }
            assert!(
                before.len() >= 5,
                "engine {e} only ever ran after {before:?}"
            );
        }
        for n in 0..10 {
            let mut s = shuffled(n, 42);
            s.sort_unstable();
            assert_eq!(s, (0..n).collect::<Vec<_>>(), "a permutation of {n}");
        }
    }

    #[test]
    fn a_failed_cell_skips_its_later_repetitions_and_keeps_its_earlier_runs() {
        let plan = Plan {
            sizes: 2,
            engines: 2,
            repeat: 3,
            seed: 0,
            together: vec![],
        };
        let mut runner = FakeRunner {
            fail: vec![slot(0, 1, 0), slot(1, 0, 1)],
            calls: Vec::new(),
        };
        let mut events = Vec::new();
        let mut grid = run(&plan, &mut runner, |s, e| {
            let tag = match e {
                Event::Done(_) => "done",
                Event::Failed(_) => "failed",
                Event::Skipped => "skipped",
            };
            events.push((s, tag));
        });
        assert_eq!(events.len(), plan.total(), "every slot is reported");
        assert!(!runner.calls.contains(&slot(1, 1, 0)));
        assert!(!runner.calls.contains(&slot(2, 1, 0)));
        assert!(!runner.calls.contains(&slot(2, 0, 1)));
        assert_eq!(runner.calls.len(), plan.total() - 3);
        assert!(events.contains(&(slot(2, 1, 0), "skipped")));

        let failed_first = grid.take(1, 0);
        assert!(failed_first.runs.is_empty());
        assert_eq!(failed_first.error.as_deref(), Some("cell 1x0 broke"));
        let failed_later = grid.take(0, 1);
        assert_eq!(failed_later.runs, [slot(0, 0, 1)]);
        assert!(failed_later.error.is_some());
        let fine = grid.take(1, 1);
        assert_eq!(fine.runs, [slot(0, 1, 1), slot(1, 1, 1), slot(2, 1, 1)]);
        assert_eq!(fine.error, None);
    }

    #[test]
    fn an_empty_plan_runs_nothing() {
        let plan = Plan {
            sizes: 0,
            engines: 3,
            repeat: 2,
            seed: 0,
            together: vec![],
        };
        let mut runner = FakeRunner {
            fail: vec![],
            calls: vec![],
        };
        run(&plan, &mut runner, |_, _| panic!("nothing to report"));
        assert!(runner.calls.is_empty());
    }
}
