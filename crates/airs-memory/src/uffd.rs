//! A minimal userfaultfd wrapper: open, API handshake, register, copy, zero-page, wake, unregister,
//! and reading fault events.
//!
//! Design: §6.4 of the model-memory chapter resolves page faults of the model region from the
//! GGUF file with `UFFDIO_COPY`. Only what the lazy loader needs is wrapped, each call in one small
//! function over `rustix::ioctl` with the uapi structs of `linux-raw-sys`; every wrapper has a
//! test on a small anonymous mapping. The descriptor is opened non-blocking and close-on-exec,
//! through `/dev/userfaultfd` (`USERFAULTFD_IOC_NEW`, allowed by the device's file mode) or, when
//! the device is missing or not accessible, through the `userfaultfd(2)` syscall with
//! `UFFD_USER_MODE_ONLY` (allowed to unprivileged users since Linux 5.11).
//! Cost: one syscall per call; `UFFDIO_COPY` copies the source once into freshly allocated pages.

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

use linux_raw_sys::general as uapi;
use linux_raw_sys::ioctl as ioc;
use rustix::io::Errno;
use rustix::ioctl::{Ioctl, IoctlOutput, Opcode, Updater};

const API: Opcode = ioc::UFFDIO_API as Opcode;
const REGISTER: Opcode = ioc::UFFDIO_REGISTER as Opcode;
const UNREGISTER: Opcode = ioc::UFFDIO_UNREGISTER as Opcode;
const COPY: Opcode = ioc::UFFDIO_COPY as Opcode;
const ZEROPAGE: Opcode = ioc::UFFDIO_ZEROPAGE as Opcode;
const WAKE: Opcode = ioc::UFFDIO_WAKE as Opcode;
/// `USERFAULTFD_IOC_NEW` = `_IO(0xAA, 0x00)` (include/uapi/linux/userfaultfd.h); not exported by
/// linux-raw-sys. `_IO` has no direction or size bits, so the value is the same on every arch.
const IOC_NEW: Opcode = rustix::ioctl::opcode::none(0xAA, 0x00);

/// Flags for the new descriptor: non-blocking reads (the handler polls) and close-on-exec.
const FD_FLAGS: u32 = uapi::O_CLOEXEC | uapi::O_NONBLOCK;

/// How the descriptor was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenedVia {
    /// `/dev/userfaultfd` + `USERFAULTFD_IOC_NEW`.
    Device,
    /// The `userfaultfd(2)` syscall with `UFFD_USER_MODE_ONLY`.
    Syscall,
}

/// One message read from the descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A thread touched a missing page at `address` (page-aligned unless EXACT_ADDRESS was asked).
    PageFault { address: u64, write: bool },
    /// Any other event (only delivered when the matching feature was requested; we request none).
    Other(u8),
}

/// An open, handshaken userfaultfd descriptor.
#[derive(Debug)]
pub struct Userfaultfd {
    fd: OwnedFd,
    opened_via: OpenedVia,
    ioctls: u64,
}

/// Result of [`Userfaultfd::copy_all`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CopyOutcome {
    /// Bytes this call installed.
    pub copied: usize,
    /// Bytes skipped because a page was already present (`EEXIST`: another path filled it).
    pub already_present: usize,
}

impl Userfaultfd {
    /// Opens a userfaultfd (device first, then syscall) and performs the `UFFDIO_API` handshake.
    /// `EPERM`/`EACCES`/`ENOENT`/`ENOSYS` mean "not permitted here"; callers degrade on them.
    pub fn open() -> Result<Self, Errno> {
        let (fd, opened_via) = match open_via_device() {
            Ok(fd) => (fd, OpenedVia::Device),
            Err(device_err) => match open_via_syscall() {
                Ok(fd) => (fd, OpenedVia::Syscall),
                // Report the device error when the syscall is simply absent.
                Err(Errno::NOSYS) => return Err(device_err),
                Err(e) => return Err(e),
            },
        };
        let mut api = uapi::uffdio_api {
            api: uapi::UFFD_API as u64,
            features: 0,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes exactly one `struct uffdio_api`, which `api` is.
        unsafe { rustix::ioctl::ioctl(&fd, Updater::<API, _>::new(&mut api)) }?;
        Ok(Self {
            fd,
            opened_via,
            ioctls: api.ioctls,
        })
    }

    /// How this descriptor was opened.
    pub fn opened_via(&self) -> OpenedVia {
        self.opened_via
    }

    /// The ioctl bitmask the handshake reported (bit n = `_UFFDIO_*` number n is supported).
    pub fn api_ioctls(&self) -> u64 {
        self.ioctls
    }

    /// Registers `[start, start + len)` for missing-page faults; returns the ioctls usable on it.
    ///
    /// # Safety
    /// The range must be a private anonymous mapping owned by the caller whose not-yet-populated
    /// pages get their contents only from this descriptor: no Rust code may rely on them reading
    /// as zero, because [`copy`](Self::copy) and [`zeropage`](Self::zeropage) define them later.
    /// Until they are resolved, any access to such a page blocks.
    pub unsafe fn register_missing(&self, start: usize, len: usize) -> Result<u64, Errno> {
        let mut reg = uapi::uffdio_register {
            range: range(start, len),
            mode: uapi::UFFDIO_REGISTER_MODE_MISSING as u64,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes one `struct uffdio_register`; the effect on the
        // range is the caller's contract above.
        unsafe { rustix::ioctl::ioctl(&self.fd, Updater::<REGISTER, _>::new(&mut reg)) }?;
        Ok(reg.ioctls)
    }

    /// Unregisters `[start, start + len)`; threads still waiting in it are woken (they then see
    /// the page or fault normally).
    pub fn unregister(&self, start: usize, len: usize) -> Result<(), Errno> {
        let mut r = range(start, len);
        // SAFETY: UFFDIO_UNREGISTER reads one `struct uffdio_range`; it only detaches this
        // descriptor from the range (the kernel rejects ranges it does not track).
        unsafe { rustix::ioctl::ioctl(&self.fd, Updater::<UNREGISTER, _>::new(&mut r)) }
    }

    /// One `UFFDIO_COPY`: installs `src` (page-multiple length) at page-aligned `dst`, waking
    /// the threads waiting there if `wake`. Returns bytes copied; on error, the errno and the
    /// bytes copied before it.
    pub fn copy(&self, dst: usize, src: &[u8], wake: bool) -> Result<usize, (Errno, usize)> {
        let mut c = uapi::uffdio_copy {
            dst: dst as u64,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: if wake {
                0
            } else {
                u64::from(uapi::UFFDIO_COPY_MODE_DONTWAKE)
            },
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY reads `src.len()` bytes from `src` (a live borrowed slice) and only
        // installs pages where none exist in a range registered with *this* descriptor (the kernel
        // returns ENOENT/EEXIST otherwise), whose contents the registrant delegated to us.
        let r = unsafe { rustix::ioctl::ioctl(&self.fd, Updater::<COPY, _>::new(&mut c)) };
        let copied = usize::try_from(c.copy.max(0)).unwrap_or(0);
        match r {
            Ok(()) => Ok(copied),
            Err(e) => Err((e, copied)),
        }
    }

    /// Copies all of `src` to `dst`, page by page past any page already present (`EEXIST`) and
    /// retrying on `EAGAIN`. `page_size` is the base page size. Wakes nobody: call
    /// [`wake`](Self::wake) after (the caller may first publish that the range is filled).
    pub fn copy_all(&self, dst: usize, src: &[u8], page_size: usize) -> Result<CopyOutcome, Errno> {
        let mut out = CopyOutcome::default();
        let mut done = 0;
        while done < src.len() {
            match self.copy(dst + done, &src[done..], false) {
                Ok(n) => {
                    out.copied += n;
                    done += n;
                    if n == 0 {
                        return Err(Errno::IO);
                    }
                }
                Err((Errno::EXIST, n)) => {
                    out.copied += n;
                    let skip = page_size.min(src.len() - done - n);
                    out.already_present += skip;
                    done += n + skip;
                }
                Err((Errno::AGAIN, n)) => {
                    // The address space is changing (e.g. a concurrent remap): retry.
                    out.copied += n;
                    done += n;
                    std::thread::yield_now();
                }
                Err((e, _)) => return Err(e),
            }
        }
        Ok(out)
    }

    /// `UFFDIO_ZEROPAGE`: maps the zero page over missing pages of `[dst, dst + len)` and wakes
    /// waiters. Existing pages are left alone. Returns bytes zero-mapped.
    pub fn zeropage(&self, dst: usize, len: usize) -> Result<usize, Errno> {
        let mut done = 0;
        while done < len {
            let mut z = uapi::uffdio_zeropage {
                range: range(dst + done, len - done),
                mode: 0,
                zeropage: 0,
            };
            // SAFETY: UFFDIO_ZEROPAGE reads/writes one `struct uffdio_zeropage`; like COPY it
            // only fills missing pages of a range registered with this descriptor.
            let r = unsafe { rustix::ioctl::ioctl(&self.fd, Updater::<ZEROPAGE, _>::new(&mut z)) };
            let n = usize::try_from(z.zeropage.max(0)).unwrap_or(0);
            match r {
                Ok(()) => break,
                Err(Errno::EXIST) => done += n + rustix::param::page_size(),
                Err(Errno::AGAIN) => done += n,
                Err(e) => return Err(e),
            }
        }
        self.wake(dst, len)?;
        Ok(len)
    }

    /// `UFFDIO_WAKE`: wakes threads waiting on `[start, start + len)` (after another path filled
    /// it).
    pub fn wake(&self, start: usize, len: usize) -> Result<(), Errno> {
        let mut r = range(start, len);
        // SAFETY: UFFDIO_WAKE reads one `struct uffdio_range` and only wakes waiters.
        unsafe { rustix::ioctl::ioctl(&self.fd, Updater::<WAKE, _>::new(&mut r)) }
    }

    /// Reads one message; `Ok(None)` when none is pending (the descriptor is non-blocking).
    pub fn read_event(&self) -> Result<Option<Event>, Errno> {
        const MSG: usize = size_of::<uapi::uffd_msg>();
        let mut buf = [0u8; MSG];
        match rustix::io::read(&self.fd, &mut buf) {
            Ok(n) if n == MSG => Ok(Some(parse_msg(&buf))),
            Ok(_) => Err(Errno::IO),
            Err(Errno::AGAIN) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl AsFd for Userfaultfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn range(start: usize, len: usize) -> uapi::uffdio_range {
    uapi::uffdio_range {
        start: start as u64,
        len: len as u64,
    }
}

/// Decodes a `struct uffd_msg` from its bytes (no union access: fields by offset).
fn parse_msg(buf: &[u8]) -> Event {
    use core::mem::offset_of;
    let u64_at = |off: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[off..off + 8]);
        u64::from_ne_bytes(b)
    };
    let event = buf[offset_of!(uapi::uffd_msg, event)];
    if u32::from(event) != uapi::UFFD_EVENT_PAGEFAULT {
        return Event::Other(event);
    }
    let arg = offset_of!(uapi::uffd_msg, arg);
    let flags = u64_at(arg + offset_of!(uapi::uffd_msg__bindgen_ty_1__bindgen_ty_1, flags));
    let address = u64_at(arg + offset_of!(uapi::uffd_msg__bindgen_ty_1__bindgen_ty_1, address));
    Event::PageFault {
        address,
        write: flags & u64::from(uapi::UFFD_PAGEFAULT_FLAG_WRITE) != 0,
    }
}

/// `USERFAULTFD_IOC_NEW`: its argument is the flags integer and its return value the new fd.
struct IocNew;

// SAFETY: the opcode is USERFAULTFD_IOC_NEW, which takes an integer (flags) by value, reads no
// user memory, and returns a new file descriptor owned by the caller.
unsafe impl Ioctl for IocNew {
    type Output = OwnedFd;
    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        IOC_NEW
    }

    fn as_ptr(&mut self) -> *mut core::ffi::c_void {
        FD_FLAGS as usize as *mut core::ffi::c_void
    }

    unsafe fn output_from_ptr(
        out: IoctlOutput,
        _: *mut core::ffi::c_void,
    ) -> rustix::io::Result<OwnedFd> {
        // SAFETY: on success USERFAULTFD_IOC_NEW returns a fresh descriptor nobody else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(out) })
    }
}

fn open_via_device() -> Result<OwnedFd, Errno> {
    let dev = rustix::fs::open(
        "/dev/userfaultfd",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    // SAFETY: IocNew matches USERFAULTFD_IOC_NEW's protocol (see its impl).
    unsafe { rustix::ioctl::ioctl(&dev, IocNew) }
}

fn open_via_syscall() -> Result<OwnedFd, Errno> {
    let flags = FD_FLAGS | uapi::UFFD_USER_MODE_ONLY;
    // SAFETY: userfaultfd(2) takes one int of flags and returns a new fd or -1 with errno.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags as libc::c_int) };
    if fd < 0 {
        return Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ));
    }
    // SAFETY: the syscall succeeded, so `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::AnonMapping;

    fn page() -> usize {
        rustix::param::page_size()
    }

    #[test]
    fn open_and_handshake() {
        let uffd = Userfaultfd::open().expect("userfaultfd available on the test machine");
        let ioctls = uffd.api_ioctls();
        assert_ne!(ioctls & (1 << uapi::_UFFDIO_REGISTER), 0);
        assert_ne!(ioctls & (1 << uapi::_UFFDIO_UNREGISTER), 0);
        assert_ne!(ioctls & (1 << uapi::_UFFDIO_API), 0);
    }

    #[test]
    fn syscall_path_handshakes() {
        let fd = open_via_syscall().expect("root may use the syscall");
        let mut api = uapi::uffdio_api {
            api: uapi::UFFD_API as u64,
            features: 0,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API on a fresh descriptor with its own struct.
        unsafe { rustix::ioctl::ioctl(&fd, Updater::<API, _>::new(&mut api)) }.unwrap();
        assert_ne!(api.ioctls, 0);
    }

    #[test]
    fn register_copy_zeropage_wake_unregister() {
        let p = page();
        let map = AnonMapping::new(4 * p, p).unwrap();
        let uffd = Userfaultfd::open().unwrap();
        // SAFETY: `map` is our private anonymous mapping; nothing reads it before we fill it.
        let ioctls = unsafe { uffd.register_missing(map.addr(), map.len()) }.unwrap();
        assert_ne!(ioctls & (1 << uapi::_UFFDIO_COPY), 0);
        assert_ne!(ioctls & (1 << uapi::_UFFDIO_ZEROPAGE), 0);

        let src: Vec<u8> = (0..2 * p).map(|i| (i % 251) as u8).collect();
        assert_eq!(uffd.copy(map.addr(), &src, true).unwrap(), 2 * p);
        // Copying again over present pages: EEXIST, nothing copied.
        let (e, n) = uffd.copy(map.addr(), &src[..p], true).unwrap_err();
        assert_eq!((e, n), (Errno::EXIST, 0));
        // copy_all over [page 1, page 3): page 1 exists, page 2 is new.
        let out = uffd.copy_all(map.addr() + p, &src, p).unwrap();
        assert_eq!(
            out,
            CopyOutcome {
                copied: p,
                already_present: p
            }
        );
        assert_eq!(uffd.zeropage(map.addr() + 3 * p, p).unwrap(), p);
        uffd.wake(map.addr(), map.len()).unwrap();
        assert_eq!(uffd.read_event().unwrap(), None);
        uffd.unregister(map.addr(), map.len()).unwrap();

        // SAFETY: every page was filled above, the mapping is live and nobody writes it.
        let bytes = unsafe { std::slice::from_raw_parts(map.addr() as *const u8, map.len()) };
        assert_eq!(&bytes[..2 * p], &src[..]);
        assert_eq!(&bytes[2 * p..3 * p], &src[p..2 * p]);
        assert!(bytes[3 * p..].iter().all(|&b| b == 0));
    }

    #[test]
    fn fault_event_is_delivered_and_resolved() {
        let p = page();
        let map = AnonMapping::new(2 * p, p).unwrap();
        let uffd = Userfaultfd::open().unwrap();
        // SAFETY: our private mapping; the reader thread below blocks until we fill it.
        unsafe { uffd.register_missing(map.addr(), map.len()) }.unwrap();
        let addr = map.addr();
        let reader = std::thread::spawn(move || {
            // SAFETY: the mapping outlives the join below; the page is filled by the uffd.
            unsafe { std::ptr::read_volatile((addr + p + 7) as *const u8) }
        });
        let event = loop {
            let mut fds = [rustix::event::PollFd::new(
                &uffd,
                rustix::event::PollFlags::IN,
            )];
            rustix::event::poll(&mut fds, None).unwrap();
            if let Some(ev) = uffd.read_event().unwrap() {
                break ev;
            }
        };
        assert_eq!(
            event,
            Event::PageFault {
                address: (addr + p) as u64,
                write: false
            }
        );
        let src = vec![42u8; p];
        uffd.copy(addr + p, &src, true).unwrap();
        assert_eq!(reader.join().unwrap(), 42);
    }

    #[test]
    fn copy_outside_registered_range_is_refused() {
        let p = page();
        let map = AnonMapping::new(p, p).unwrap();
        let uffd = Userfaultfd::open().unwrap();
        let src = vec![1u8; p];
        assert!(uffd.copy(map.addr(), &src, true).is_err());
    }

    #[test]
    fn collapse_works_on_an_armed_fully_populated_block() {
        // The lazy loader collapses completed blocks while the region is still registered.
        if !matches!(
            crate::sys::thp_mode(),
            crate::sys::ThpMode::Always | crate::sys::ThpMode::Madvise
        ) {
            return;
        }
        let huge = crate::sys::huge_page_size();
        let map = AnonMapping::new(2 * huge, huge).unwrap();
        let uffd = Userfaultfd::open().unwrap();
        // SAFETY: our private mapping; nothing reads it.
        unsafe { uffd.register_missing(map.addr(), map.len()) }.unwrap();
        uffd.copy(map.addr(), &vec![3u8; huge], true).unwrap();
        map.collapse(0, huge).unwrap();
        let t = crate::sys::smaps_totals(map.addr(), map.addr() + map.len()).unwrap();
        assert_eq!(t.huge, huge as u64);
        uffd.unregister(map.addr(), map.len()).unwrap();
    }
}
