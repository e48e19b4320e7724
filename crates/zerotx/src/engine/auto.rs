//! The old home of [`EpochClock`], named here until the engines import it from
//! [`clock`](super::clock). `auto`'s choice of a family lives in the engine factory
//! (`factory.rs`), its per-send choice in [`policy::auto`](super::policy::auto).

pub(crate) use super::clock::EpochClock;
