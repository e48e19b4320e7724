//! One `Bytes` sent whole, as tokio's `write_all` writes a slice: cut into slices that share its
//! storage, and done when the kernel released every slice.

use std::collections::VecDeque;

use bytes::Bytes;

use super::AsyncSender;
use crate::error::{Error, SendError};
use crate::report::Released;

/// The largest slice [`AsyncSender::write_all`] sends. Several slices of a large `Bytes` are in
/// the kernel at once, so the first come back (and a failure is known) while later ones go out,
/// and each stays far above the sizes below which `auto` copies.
pub const WRITE_SLICE: usize = 256 << 10;

impl AsyncSender<Bytes> {
    /// Sends all of `data`, in slices of at most 256 KiB that share its storage
    /// (`Bytes::slice`: no copy), and resolves once the kernel released every slice. Fails with
    /// the first failure: a slice the sender refused ([`Error::Io`]), or a slice released with an
    /// error ([`Error::Failed`]: the peer did not get all its bytes; on a stream, nothing more
    /// goes). Slices still in the kernel after a failure come back through
    /// [`released`](Self::released) as usual.
    ///
    /// It takes its own slices' releases (known by their addresses inside `data`) from the
    /// sender's queue, leaving other buffers' releases in place. A consumer that takes releases
    /// meanwhile ([`releases`](Self::releases)) may take some of these slices first; their
    /// failures are then reported the way [`flush`](Self::flush) reports them.
    ///
    /// Cancel-safe as [`send`](Self::send) is: slices already accepted stay with the sender
    /// until the kernel released them.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use bytes::Bytes;
    /// use zerotx::tokio::AsyncSender;
    /// use zerotx::EngineKind;
    ///
    /// let stream = tokio::net::TcpStream::connect("127.0.0.1:9000").await?;
    /// let tx = AsyncSender::<Bytes>::from_tcp(stream, EngineKind::Auto)?;
    /// let object = Bytes::from(vec![7u8; 4 << 20]);
    /// tx.write_all(object).await?; // every byte went, and the kernel let go of it
    /// # Ok(()) }
    /// ```
    pub async fn write_all(&self, data: Bytes) -> Result<(), Error> {
        let mut left = VecDeque::new();
        let mut at = 0;
        while at < data.len() {
            let end = data.len().min(at + WRITE_SLICE);
            left.push_back(data.slice(at..end));
            at = end;
        }
        let mut mine = Mine {
            range: data.as_ptr() as usize..data.as_ptr() as usize + data.len(),
            held: 0,
            taken: 0,
        };
        while let Some(slice) = left.pop_front() {
            match self.send(slice).await {
                Ok(()) => mine.held += 1,
                Err(SendError::Io { error, .. }) => {
                    return Err(Error::Io {
                        context: "sending a slice of write_all's bytes",
                        source: error,
                    });
                }
                Err(e) => {
                    return Err(Error::Io {
                        context: "sending a slice of write_all's bytes",
                        source: e.into(),
                    });
                }
            }
            mine.take(&mut self.shared.lock().released)?;
        }
        loop {
            let notified = self.shared.owner.notified();
            ::tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.shared.lock();
                st.reap_for_owner(&self.shared.owner, self.watched());
                mine.take(&mut st.released)?;
                if mine.taken == mine.held {
                    return Ok(());
                }
                if let Some(source) = st.error.take() {
                    return Err(Error::Io {
                        context: "waiting for write_all's slices to be released",
                        source,
                    });
                }
                if st.tx().in_flight() == 0 {
                    // Another consumer took the rest: the sender's failure rule speaks for them.
                    return st.tx().flushed();
                }
            }
            notified.await;
        }
    }
}

/// The slices of one `write_all`: their addresses, and how many were accepted and taken back.
struct Mine {
    range: std::ops::Range<usize>,
    held: usize,
    taken: usize,
}

impl Mine {
    /// Takes this call's slices out of `released` (others stay, in order); fails on the first
    /// that carried an error.
    fn take(&mut self, released: &mut VecDeque<Released<Bytes>>) -> Result<(), Error> {
        if self.taken == self.held {
            return Ok(());
        }
        let mut failed = None;
        let (range, held, taken) = (&self.range, self.held, &mut self.taken);
        released.retain_mut(|r| {
            let ours = *taken < held && range.contains(&(r.buf.as_ptr() as usize));
            if ours {
                *taken += 1;
                if failed.is_none() {
                    failed = r.report.error.take();
                }
            }
            !ours
        });
        match failed {
            Some(source) => Err(Error::Failed { failed: 1, source }),
            None => Ok(()),
        }
    }
}
