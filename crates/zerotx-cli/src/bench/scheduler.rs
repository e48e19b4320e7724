//! The order of runs, apart from how a run is made (hyperfine keeps its scheduler testable with a
//! mock executor; here the runner is a trait and the tests bring a fake one).
//!
//! - **Interleaved repetitions.** Repetition `r` goes over every size, and at each size over every
//!   engine, starting with engine `r mod engines`: each repetition starts with a different
//!   engine, so drift on a shared machine (another tenant, a warming cache, thermal limits)
//!   spreads over all engines instead of landing on whichever always runs first or last.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Sizes.
    pub sizes: usize,
    /// Engine columns.
    pub engines: usize,
    /// Repetitions per cell.
    pub repeat: usize,
}

impl Plan {
    /// Runs in the plan, skipped ones included.
    pub fn total(&self) -> usize {
        self.sizes * self.engines * self.repeat
    }

    /// Every slot, in the order they run.
    pub fn order(&self) -> impl Iterator<Item = Slot> + '_ {
        (0..self.repeat).flat_map(move |rep| {
            (0..self.sizes).flat_map(move |size| {
                (0..self.engines).map(move |k| Slot {
                    rep,
                    size,
                    engine: (k + rep) % self.engines,
                })
            })
        })
    }
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
    fn each_repetition_starts_with_another_engine_and_covers_every_cell() {
        let plan = Plan {
            sizes: 2,
            engines: 3,
            repeat: 3,
        };
        let order: Vec<Slot> = plan.order().collect();
        assert_eq!(order.len(), plan.total());
        let firsts: Vec<usize> = (0..3).map(|r| order[r * 6].engine).collect();
        assert_eq!(firsts, [0, 1, 2]);
        // Within a repetition and size, every engine once, rotated.
        let rep1_size0: Vec<usize> = order[6..9].iter().map(|s| s.engine).collect();
        assert_eq!(rep1_size0, [1, 2, 0]);
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
    fn a_failed_cell_skips_its_later_repetitions_and_keeps_its_earlier_runs() {
        let plan = Plan {
            sizes: 2,
            engines: 2,
            repeat: 3,
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
        };
        let mut runner = FakeRunner {
            fail: vec![],
            calls: vec![],
        };
        run(&plan, &mut runner, |_, _| panic!("nothing to report"));
        assert!(runner.calls.is_empty());
    }
}
