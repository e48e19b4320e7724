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
    /// `train-auto`: zerotx's `auto`, one [`Sender::send_train`](zerotx::Sender::send_train) per
    /// train.
    TrainAuto,
    /// `train-copy`: zerotx's `copy`, trains by `send_train` (GSO without zero-copy).
    TrainCopy,
    /// `train-msg-zc`: zerotx's `msg-zc`, trains by `send_train` (`MSG_ZEROCOPY`, one id per
    /// train).
    TrainMsgZc,
    /// `train-uring`: zerotx's `uring`, trains by `send_train`.
    TrainUring,
    /// `train-uring-zc`: zerotx's `uring-zc`, trains by `send_train`.
    TrainUringZc,
    /// `train-uring-zc-fixed`: zerotx's `uring-zc` from the registered ring, trains by
    /// `send_train`.
    TrainUringZcFixed,
}

impl Engine {
    /// Registers its buffer ring with io_uring (so the ring must be on small pages). `auto`
    /// offers the ring for registration too, but takes a huge one as unregistered.
    pub fn registers_ring(self) -> bool {
        matches!(
            self,
            Engine::UringZcFixed | Engine::RawUringZcFixed | Engine::TrainUringZcFixed
        )
    }

    /// zerotx's engines: the default columns, `auto` first.
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

    /// The train columns (`--trains`): zerotx's engines sending UDP GSO trains through
    /// `Sender::send_train`, and the raw train loops, their baselines. `Cells` gives every train
    /// column a ring of `size x datagrams`-byte buffers and the datagram count.
    pub const TRAINS: [Engine; 8] = [
        Engine::TrainAuto,
        Engine::TrainCopy,
        Engine::TrainMsgZc,
        Engine::TrainUring,
        Engine::TrainUringZc,
        Engine::TrainUringZcFixed,
        Engine::RawTrainCopy,
        Engine::RawTrainMsgZc,
    ];

    /// Whether one send is a train of datagrams of the cell's size (one `UDP_SEGMENT` call).
    pub fn is_train(self) -> bool {
        matches!(
            self,
            Engine::RawTrainCopy
                | Engine::RawTrainMsgZc
                | Engine::TrainAuto
                | Engine::TrainCopy
                | Engine::TrainMsgZc
                | Engine::TrainUring
                | Engine::TrainUringZc
                | Engine::TrainUringZcFixed
        )
    }

    /// zerotx's train columns, `train-auto` first: the [`ZEROTX`](Self::ZEROTX) engines sending
    /// trains.
    pub const ZEROTX_TRAINS: [Engine; 6] = [
        Engine::TrainAuto,
        Engine::TrainCopy,
        Engine::TrainMsgZc,
        Engine::TrainUring,
        Engine::TrainUringZc,
        Engine::TrainUringZcFixed,
    ];

    /// Every column, in table order.
    pub const ALL: [Engine; 18] = [
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
        Engine::TrainAuto,
        Engine::TrainCopy,
        Engine::TrainMsgZc,
        Engine::TrainUring,
        Engine::TrainUringZc,
        Engine::TrainUringZcFixed,
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
            Engine::TrainAuto => "train-auto",
            Engine::TrainCopy => "train-copy",
            Engine::TrainMsgZc => "train-msg-zc",
            Engine::TrainUring => "train-uring",
            Engine::TrainUringZc => "train-uring-zc",
            Engine::TrainUringZcFixed => "train-uring-zc-fixed",
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
