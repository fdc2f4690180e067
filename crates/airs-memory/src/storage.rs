//! Reading the model file: the one function every loader read goes through, with an optional
//! token-bucket rate limit that emulates slow storage (an SD card reads ~100 MB/s sequentially).
//!
//! Design: §6.4 loads from "space storage" on SD cards; to measure time-to-first-token at the
//! storage limit on a fast dev machine, the loader's reads can be paced. After a range has been
//! copied into the anonymous region, its page-cache copy is dropped (`POSIX_FADV_DONTNEED`) so the
//! model is not resident twice.
//! Cost: one `pread` per call (more on short reads); the limiter adds a mutex and a sleep.

use std::fs::File;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::io::Errno;

use crate::error::{ErrorKind, MemoryError, Result};

/// Paces transfers to `bytes_per_s`, served one after another like a single device queue.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    bytes_per_s: u64,
    next_free: Mutex<Instant>,
}

impl RateLimiter {
    pub fn new(bytes_per_s: u64) -> Self {
        Self {
            bytes_per_s: bytes_per_s.max(1),
            next_free: Mutex::new(Instant::now()),
        }
    }

    /// Books a transfer of `bytes` and returns when it completes.
    pub fn reserve(&self, bytes: usize) -> Instant {
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_s as f64);
        let mut next = self.next_free.lock().unwrap_or_else(|e| e.into_inner());
        let start = (*next).max(Instant::now());
        *next = start + cost;
        *next
    }
}

/// Sleeps until `t` (no-op if past).
pub(crate) fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// The open model file plus the read pacing.
#[derive(Debug)]
pub(crate) struct Storage {
    file: File,
    path: PathBuf,
    limiter: Option<RateLimiter>,
}

impl Storage {
    /// Opens `path`; returns the storage and the file length.
    pub fn open(path: &Path, bytes_per_s: Option<u64>) -> Result<(Self, u64)> {
        let open_err = |e| MemoryError::with_io(ErrorKind::Open, path.display().to_string(), e);
        let file = File::open(path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        Ok((
            Self {
                file,
                path: path.to_owned(),
                limiter: bytes_per_s.map(RateLimiter::new),
            },
            len,
        ))
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Reads exactly `buf.len()` bytes at `offset`, paced by the limiter. End of file before the
    /// buffer is full is [`ErrorKind::Truncated`].
    pub fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let done_at = self.read_booked(offset, buf)?;
        if let Some(t) = done_at {
            sleep_until(t);
        }
        Ok(())
    }

    /// [`Storage::read_exact_at`] without the wait: books the transfer on the paced device and
    /// returns when the device will have delivered it (`None` when unpaced). The caller must not
    /// use the bytes before then; booking the next read before waiting keeps the emulated device
    /// busy while the previous chunk is copied, as a device queue with readahead would.
    pub fn read_booked(&self, offset: u64, buf: &mut [u8]) -> Result<Option<Instant>> {
        let done_at = self.limiter.as_ref().map(|l| l.reserve(buf.len()));
        let mut filled = 0;
        while filled < buf.len() {
            let at = offset + filled as u64;
            match rustix::io::pread(&self.file, &mut buf[filled..], at) {
                Ok(0) => {
                    return Err(MemoryError::new(
                        ErrorKind::Truncated,
                        format!(
                            "{}: end of file at byte {at}, expected {} more bytes",
                            self.path.display(),
                            buf.len() - filled
                        ),
                    ));
                }
                Ok(n) => filled += n,
                Err(Errno::INTR) => {}
                Err(e) => {
                    return Err(MemoryError::with_errno(
                        ErrorKind::Read,
                        format!("{}: read at byte {at}", self.path.display()),
                        e,
                    ));
                }
            }
        }
        Ok(done_at)
    }

    /// Starts asynchronous readahead of `[offset, offset + len)` (`POSIX_FADV_WILLNEED`), so the
    /// device works on the next chunk while the current one is copied.
    pub fn will_need(&self, offset: u64, len: u64) {
        // Advisory: failure only loses the overlap.
        let _ = rustix::fs::fadvise(
            &self.file,
            offset,
            NonZeroU64::new(len),
            rustix::fs::Advice::WillNeed,
        );
    }

    /// Drops the page-cache copy of `[offset, offset + len)` (the region holds the bytes now).
    pub fn drop_cache(&self, offset: u64, len: u64) {
        // Advisory: failure only means the page cache keeps a copy for a while.
        let _ = rustix::fs::fadvise(
            &self.file,
            offset,
            NonZeroU64::new(len),
            rustix::fs::Advice::DontNeed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_paces_transfers_back_to_back() {
        let l = RateLimiter::new(1_000_000);
        let t0 = Instant::now();
        let a = l.reserve(100_000);
        let b = l.reserve(100_000);
        assert!(a >= t0 + Duration::from_millis(99));
        assert!(b >= t0 + Duration::from_millis(199));
    }

    #[test]
    fn short_file_is_truncated_error() {
        let dir = std::env::temp_dir().join(format!("airs-mem-storage-{}", std::process::id()));
        std::fs::write(&dir, b"hello").unwrap();
        let (s, len) = Storage::open(&dir, None).unwrap();
        assert_eq!(len, 5);
        let mut buf = [0u8; 4];
        s.read_exact_at(1, &mut buf).unwrap();
        assert_eq!(&buf, b"ello");
        let mut big = [0u8; 8];
        assert_eq!(
            s.read_exact_at(0, &mut big).unwrap_err().kind(),
            ErrorKind::Truncated
        );
        std::fs::remove_file(&dir).unwrap();
    }
}
