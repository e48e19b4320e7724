//! The engine columns `zerotx bench` can measure, as the CLI and scripts name them: zerotx's own
//! engines, and the baselines they are judged against.

use std::str::FromStr;

use serde::Serialize;

/// One engine column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Engine {
    /// `auto`: zerotx's default, choosing per socket and per send (with the buffer ring
    /// registered, as a user with a pool would).
    Auto,
    /// `copy`: zerotx, plain `sendmsg`.
    Copy,
    /// `msg-zc`: zerotx, `sendmsg(MSG_ZEROCOPY)`.
    MsgZc,
    /// `uring`: zerotx, io_uring `SENDMSG`.
    Uring,
    /// `uring-zc`: zerotx, io_uring `SEND_ZC`/`SENDMSG_ZC` from user memory.
    UringZc,
    /// `uring-zc-fixed`: zerotx's uring-zc from a registered buffer ring.
    UringZcFixed,
    /// `raw-copy`: a bare `send(2)` loop.
    RawCopy,
    /// `raw-msg-zc`: a bare `send(MSG_ZEROCOPY)` loop reading `MSG_ERRQUEUE` itself.
    RawMsgZc,
    /// `raw-uring-zc-fixed`: bare `IORING_OP_SEND_ZC` from registered buffers.
    RawUringZcFixed,
    /// `liburing-zc-fixed`: liburing's `examples/send-zerocopy` with fixed buffers, run as a child.
    LiburingZcFixed,
    /// `raw-train-copy`: a bare `send(2)` loop of UDP GSO trains (`UDP_SEGMENT`), one train per
    /// call.
    RawTrainCopy,
    /// `raw-train-msg-zc`: a bare `send(MSG_ZEROCOPY)` loop of UDP GSO trains, one completion id
    /// per train.
    RawTrainMsgZc,
}

impl Engine {
    /// Registers its buffer ring with io_uring (so the ring must be on small pages). `auto`
    /// offers the ring for registration too, but takes a huge one as unregistered.
    pub fn registers_ring(self) -> bool {
        matches!(self, Engine::UringZcFixed | Engine::RawUringZcFixed)
    }

    /// zerotx's engines: the default columns.
    pub const ZEROTX: [Engine; 6] = [
        Engine::Auto,
        Engine::Copy,
        Engine::MsgZc,
        Engine::Uring,
        Engine::UringZc,
        Engine::UringZcFixed,
    ];

    /// The minimal senders written for the comparison (`--baselines`).
    pub const RAW: [Engine; 3] = [Engine::RawCopy, Engine::RawMsgZc, Engine::RawUringZcFixed];

    /// The raw UDP GSO train loops (`--trains`): the baselines of datagram trains. zerotx's own
    /// train columns join them here and in [`is_train`](Self::is_train); `Cells` gives every
    /// train column a ring of `size x datagrams`-byte buffers and the datagram count.
    pub const TRAINS: [Engine; 2] = [Engine::RawTrainCopy, Engine::RawTrainMsgZc];

    /// Whether one send is a train of datagrams of the cell's size (one `UDP_SEGMENT` call).
    pub fn is_train(self) -> bool {
        matches!(self, Engine::RawTrainCopy | Engine::RawTrainMsgZc)
    }

    /// Every column, in table order.
    pub const ALL: [Engine; 12] = [
        Engine::Auto,
        Engine::Copy,
        Engine::MsgZc,
        Engine::Uring,
        Engine::UringZc,
        Engine::UringZcFixed,
        Engine::RawCopy,
        Engine::RawMsgZc,
        Engine::RawUringZcFixed,
        Engine::LiburingZcFixed,
        Engine::RawTrainCopy,
        Engine::RawTrainMsgZc,
    ];

    /// The name in flags, tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Auto => "auto",
            Engine::Copy => "copy",
            Engine::MsgZc => "msg-zc",
            Engine::Uring => "uring",
            Engine::UringZc => "uring-zc",
            Engine::UringZcFixed => "uring-zc-fixed",
            Engine::RawCopy => "raw-copy",
            Engine::RawMsgZc => "raw-msg-zc",
            Engine::RawUringZcFixed => "raw-uring-zc-fixed",
            Engine::LiburingZcFixed => "liburing-zc-fixed",
            Engine::RawTrainCopy => "raw-train-copy",
            Engine::RawTrainMsgZc => "raw-train-msg-zc",
        }
    }
}

impl FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Engine::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Engine::ALL.iter().map(|e| e.name()).collect();
                format!(
                    "unknown engine {s:?}; expected one of: {}",
                    names.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_choices() {
        for e in Engine::ALL {
            assert_eq!(e.name().parse::<Engine>().unwrap(), e);
        }
        let err = "turbo".parse::<Engine>().unwrap_err();
        assert!(err.contains("unknown engine \"turbo\"") && err.contains("raw-msg-zc"));
    }
}
