//! A stream of released buffers that a consumer runs beside the sender, and that ends only when
//! the sender is closed.
//!
//! [`AsyncSender::released`] answers `None` whenever nothing is in flight, which is right for a
//! loop that drains after a burst and wrong for a consumer task started before the first send
//! (it would end at once, or between two bursts). [`Releases`] waits through those gaps instead.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::driver::Shared;
use super::AsyncSender;
use crate::buf::SendBuf;
use crate::report::Released;

/// Every buffer the sender releases, in order, as a stream: see [`AsyncSender::releases`].
///
/// Items are `io::Result`s: an `Err` is an error met while collecting completions (as
/// [`AsyncSender::released`] reports it), after which the stream goes on. It ends (`None`) once
/// the sender was closed (or dropped, and its driver finished) and every buffer released before
/// that was taken. Buffers still waiting when [`AsyncSender::close`] runs come back in
/// [`Closed::released`](crate::Closed::released) instead.
///
/// Implements `futures_core::Stream`; [`next`](Self::next) serves without it.
#[must_use = "a release stream takes nothing unless polled"]
pub struct Releases<B: SendBuf> {
    shared: Arc<Shared<B>>,
    /// The sender's completions are routed by a shared ring's watcher.
    watched: bool,
    /// The wake-up a pending poll waits for (made only when nothing was there to take).
    wait: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<B: SendBuf> std::fmt::Debug for Releases<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Releases").finish_non_exhaustive()
    }
}

impl<B: SendBuf> AsyncSender<B> {
    /// The released buffers as a stream that waits while nothing is in flight and ends only
    /// when the sender is closed: for a consumer task beside the sending one. It shares the
    /// sender's one queue of released buffers with [`released`](Self::released) and
    /// [`drain_released`](Self::drain_released) (each buffer comes out once, to whichever asks).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use bytes::Bytes;
    /// use std::time::Duration;
    /// use zerotx::tokio::AsyncSender;
    /// use zerotx::EngineKind;
    ///
    /// let stream = tokio::net::TcpStream::connect("127.0.0.1:9000").await?;
    /// let tx = AsyncSender::<Bytes>::from_tcp(stream, EngineKind::Auto)?;
    /// let mut releases = tx.releases();
    /// let consumer = tokio::spawn(async move {
    ///     let mut bytes = 0;
    ///     while let Some(done) = releases.next().await {
    ///         bytes += done?.report.bytes;
    ///     }
    ///     Ok::<_, std::io::Error>(bytes) // the sender was closed
    /// });
    /// tx.send(Bytes::from_static(b"hello")).await?;
    /// let closed = tx.close(Duration::from_secs(5)).await;
    /// assert_eq!(closed.kept, 0);
    /// println!("{} bytes released", consumer.await??);
    /// # Ok(()) }
    /// ```
    pub fn releases(&self) -> Releases<B> {
        Releases {
            shared: self.shared.clone(),
            watched: self.watched,
            wait: None,
        }
    }
}

impl<B: SendBuf> Releases<B> {
    /// The next released buffer: waits while none is there, `None` once the sender was closed
    /// and nothing released is left.
    pub async fn next(&mut self) -> Option<io::Result<Released<B>>> {
        std::future::poll_fn(|cx| self.poll_release(cx)).await
    }

    /// One look without waiting: `Some` when there is an answer.
    fn take(&self) -> Option<Option<io::Result<Released<B>>>> {
        let mut st = self.shared.lock();
        loop {
            if let Some(r) = st.released.pop_front() {
                return Some(Some(Ok(r)));
            }
            if let Some(e) = st.error.take() {
                return Some(Some(Err(e)));
            }
            if st.tx.is_none() {
                return Some(None);
            }
            let watched = self.watched.then_some(&*self.shared.driver);
            if st.reap_for_owner(&self.shared.owner, watched) == 0 {
                return None;
            }
        }
    }

    fn poll_release(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Released<B>>>> {
        loop {
            if let Some(wait) = self.wait.as_mut() {
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
            }
            if let Some(answer) = self.take() {
                return Poll::Ready(answer);
            }
            // Registered before the second look, so a release between the look and the wait
            // wakes it.
            let shared = self.shared.clone();
            let mut wait: Pin<Box<dyn Future<Output = ()> + Send>> =
                Box::pin(async move { shared.owner.notified().await });
            if wait.as_mut().poll(cx).is_ready() {
                continue;
            }
            if let Some(answer) = self.take() {
                return Poll::Ready(answer);
            }
            self.wait = Some(wait);
            return Poll::Pending;
        }
    }
}

impl<B: SendBuf> futures_core::Stream for Releases<B> {
    type Item = io::Result<Released<B>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_release(cx)
    }
}
