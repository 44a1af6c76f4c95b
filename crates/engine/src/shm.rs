//! The same-host wire: devices on one machine (and in one network
//! namespace) hand each other their RoCEv2 datagrams through rings in
//! shared memory instead of the kernel's UDP path. The bytes are the same
//! datagrams, less the ICRC (which no switch or capture here would check)
//! and, where the payload lies in memory the receiver can map, less the
//! payload: a reference to it takes its place, and the receiver copies it
//! once, straight into the destination
//! ([`softrnic_transport::by_reference`]). The transport's state machines
//! see the same packets as over UDP; a device that injects corruption
//! seals its datagrams to the rings with an ICRC and their payloads.
//!
//! Each device publishes an *inbox*: a file named after its network
//! namespace and address, holding one ring per shard, in its user's
//! private directory `/dev/shm/softrnic-<uid>` (mode 0700: another user
//! can neither plant an inbox there nor read one). A sender
//! that finds a peer's inbox writes into the ring of the shard that owns
//! the destination QP; one that does not sends over UDP. The rings are
//! bounded multi-producer, single-consumer queues ([`softrnic_ring::mpsc`], where
//! the model checker runs their protocol): a producer claims a slot by
//! advancing the shared `tail`, fills it, and publishes it by setting the
//! slot's sequence number; the consumer (the shard) reads in order. Like
//! the rxe driver's mmap'd queues, every index and length a peer wrote is
//! checked before use: a peer is another process, and may be broken.
//!
//! Only the same user's devices meet here: a sender opens an inbox only
//! from its own private directory, not through a symlink, and only a
//! regular file of its own with no access for anyone else. Devices of
//! different users on one host reach each other over UDP, where the
//! kernel vouches for each datagram's source; a ring's source address is
//! its writer's word, and only a process of the same user (which could
//! read this one's memory anyway) or softrnicd writes it.
//!
//! ```text
//!  inbox  | header: magic, version, shards, slots, slot size |
//!         | ring 0: tail | sleeping | slot 0 | slot 1 | ...  |  ring 1 ...
//!  slot   | seq | len | source address | datagram ...       |
//! ```
//!
//! A consumer that blocks says so in its ring's `sleeping` word; the
//! producer that finds it set rings the ring's doorbell: a byte to a unix
//! datagram socket beside the inbox (`<inbox>.bell<shard>`, in the same
//! private directory), which the shard's engine thread is blocked on with
//! its UDP socket. The word follows [`softrnic_ring::wakeup`]'s protocol
//! (a fence between each side's store and its load), so that a datagram
//! published as the consumer decides to sleep is either found by it or
//! wakes it. Nothing but RoCEv2 goes to UDP port 4791: a capture of the
//! host's loopback shows no wake-ups (they were 8-byte datagrams there
//! once), and a doorbell needs no route, so it rings across the network
//! namespaces of one softrnicd's embedded switch as well.
//!
//! The devices that find each other's inboxes are those of one [`Scope`]:
//! one network namespace, or every device of one softrnicd (its embedded
//! switch).

use std::fs::OpenOptions;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use memmap2::MmapRaw;
use rustc_hash::FxHashMap;
use softrnic_transport::{DmaBuffer, MAX_DATAGRAM_LEN, shard_of};

use softrnic_ring::mpsc::{self as ring, Head, Ring};
use softrnic_ring::wakeup;

const MAGIC: u64 = u64::from_le_bytes(*b"SRNICSHM");
/// 2: the `sleeping` word is 64 bits, for the wake-up protocol.
/// 3: a sleeping consumer is woken by its ring's doorbell, not a datagram.
/// 4: an entry from port [`NO_ICRC_PORT`] carries no ICRC.
/// 5: such an entry may carry its payload by reference
/// ([`softrnic_transport::by_reference`]), which a device of version 4
/// would place as bytes.
/// 6: a packet by reference may stand for several MTUs
/// ([`softrnic_transport::by_reference::MAX_SPAN_BYTES`]), which a device
/// of version 5 would refuse as an invalid request.
const VERSION: u32 = 6;
/// The source port of an entry whose datagram carries no ICRC
/// ([`softrnic_transport::Egress::SameHost`]): 0, which no UDP datagram
/// comes from.
pub const NO_ICRC_PORT: u16 = 0;
/// Slots per ring: a power of two.
pub const SLOTS: u32 = 512;
/// Bytes of a slot: its header, then the datagram.
const SLOT_SIZE: usize = SLOT_DATA + MAX_DATAGRAM_LEN.next_multiple_of(64);
/// A ring's own header: `tail` and `sleeping`, each on its own cache lines.
const RING_HEADER: usize = 256;
const FILE_HEADER: usize = 64;
/// How long a claimed slot may stay unpublished before the consumer gives
/// up on it (its producer died or hangs); the ring must not stall.
const ABANDONED_AFTER: Duration = Duration::from_millis(20);
/// How often a consumer finding its ring empty asks whether the head's
/// slot was claimed (a producer that died mid-write): rarely enough that
/// its reads of the ring's tail do not pull that line from the producers
/// on every datagram, often enough that a stuck slot is seen long before
/// [`ABANDONED_AFTER`].
const LOOKS_PER_TAIL_READ: u32 = 64;
/// How long a sender trusts what it found about a peer (no inbox, or a
/// live device behind one) before looking again.
const RECHECK: Duration = Duration::from_secs(1);

/// The inbox file's header. Every field is atomic: a peer reads it while
/// its owner writes it.
#[repr(C)]
struct FileHeader {
    /// [`MAGIC`], stored last: a peer trusts the rest once it reads it.
    magic: AtomicU64,
    version: AtomicU32,
    shards: AtomicU32,
    slots: AtomicU32,
    slot_size: AtomicU32,
    /// The owner's PID namespace, by its inode: a peer in another one
    /// cannot name this device's processes, nor it the peer's, so payloads
    /// between them travel in the datagrams, never by reference.
    pid_namespace: AtomicU64,
}

/// A ring's header: producers advance `tail`; the consumer says in
/// `sleeping` that it blocks. Each has cache lines of its own.
#[repr(C)]
struct RingHeader {
    tail: AtomicU64,
    _tail_lines: [AtomicU64; 15],
    sleeping: AtomicU64,
}

/// A slot's header, the datagram after it at [`SLOT_DATA`]. Never read
/// through a reference (its bytes are copied, its words loaded): only its
/// field offsets are used.
#[repr(C)]
struct SlotHeader {
    /// The ring protocol's sequence number ([`softrnic_ring::mpsc`]).
    seq: AtomicU64,
    /// The datagram's length.
    len: AtomicU32,
    /// The source port (in this host's byte order: peers share a host),
    /// the address family (4 or 6), 0.
    port: [u8; 4],
    /// The source address: 4 or 16 bytes.
    addr: [u8; 16],
}

/// Where a slot's datagram starts: its own cache line.
const SLOT_DATA: usize = 64;

// The layout peers agree on, checked as the compiler lays it out.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(FileHeader, version) == 8 && offset_of!(FileHeader, slot_size) == 20);
    assert!(offset_of!(FileHeader, pid_namespace) == 24);
    assert!(size_of::<FileHeader>() <= FILE_HEADER);
    assert!(offset_of!(RingHeader, sleeping) == 128 && size_of::<RingHeader>() <= RING_HEADER);
    assert!(offset_of!(SlotHeader, len) == 8 && offset_of!(SlotHeader, port) == 12);
    assert!(offset_of!(SlotHeader, addr) == 16 && size_of::<SlotHeader>() <= SLOT_DATA);
    assert!(FILE_HEADER.is_multiple_of(64) && RING_HEADER.is_multiple_of(64) && SLOT_SIZE.is_multiple_of(64));
};
const S_SEQ: usize = std::mem::offset_of!(SlotHeader, seq);
const S_LEN: usize = std::mem::offset_of!(SlotHeader, len);
const S_PORT: usize = std::mem::offset_of!(SlotHeader, port);
const S_ADDR: usize = std::mem::offset_of!(SlotHeader, addr);

/// The network namespace of the calling thread, by its inode: a device
/// belongs to the namespace of the thread that opened it (softrnicd opens
/// a container's devices from a thread moved into the container's).
pub fn this_netns() -> io::Result<u64> {
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino())
}

/// The PID namespace of this process, by its inode (0 if it cannot be
/// read: then no peer is taken to share it). Read once: a process's own
/// does not change.
fn this_pid_namespace() -> u64 {
    static OURS: OnceLock<u64> = OnceLock::new();
    *OURS.get_or_init(|| std::fs::metadata("/proc/self/ns/pid").map_or(0, |meta| meta.ino()))
}

/// Which devices find each other's inboxes, and so reach each other
/// through shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Those of one network namespace (by its inode): devices that reach
    /// each other over the namespace's own loopback.
    Netns(u64),
    /// Every device of one softrnicd (by its pid), whatever namespace each
    /// serves: the daemon's embedded switch, which passes datagrams between
    /// containers as an SR-IOV NIC's passes them between its virtual
    /// functions, without the namespaces' network (`softrnicd
    /// --embedded-switch`). Addresses are unique across it.
    Switch(u32),
}

impl Scope {
    /// The network namespace of the calling thread.
    pub fn this_netns() -> io::Result<Scope> {
        this_netns().map(Scope::Netns)
    }

    /// Where the inbox of `addr` lives, in `dir` ([`inbox_dir`]).
    fn inbox_path(self, dir: &Path, addr: IpAddr) -> PathBuf {
        match self {
            Scope::Netns(netns) => dir.join(format!("netns{netns}-{addr}")),
            Scope::Switch(pid) => dir.join(format!("switch{pid}-{addr}")),
        }
    }
}

/// Where the doorbell of shard `shard`'s ring of the inbox at `inbox` is.
fn bell_path(inbox: &Path, shard: usize) -> PathBuf {
    let mut path = inbox.as_os_str().to_owned();
    path.push(format!(".bell{shard}"));
    PathBuf::from(path)
}

/// This user's directory of inboxes, `/dev/shm/softrnic-<uid>`: created
/// private (mode 0700) if missing, and refused with what is wrong if
/// another user made it first or let others in.
pub fn inbox_dir() -> io::Result<PathBuf> {
    let dir = PathBuf::from(format!("/dev/shm/softrnic-{}", rustix::process::getuid().as_raw()));
    crate::runtime_dir::make_private(&dir)?;
    Ok(dir)
}

/// Opens an inbox file, never through a symlink, read and write.
fn open_inbox(path: &Path) -> io::Result<std::fs::File> {
    OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Whether `file` is an inbox a device of this user made: a regular file
/// of this user's that no one else may read or write (someone who could
/// would see every datagram, or forge them).
fn is_own_private_file(file: &std::fs::File) -> bool {
    let Ok(meta) = file.metadata() else { return false };
    meta.is_file() && meta.uid() == rustix::process::getuid().as_raw() && meta.mode() & 0o077 == 0
}

fn file_len(shards: usize) -> usize {
    FILE_HEADER + shards * ring_len()
}

fn ring_len() -> usize {
    RING_HEADER + SLOTS as usize * SLOT_SIZE
}

/// A mapped inbox file, ours or a peer's.
struct Mapping {
    map: MmapRaw,
    /// Byte copies in and out of the map, atomic (another process writes
    /// it at the same time).
    bytes: DmaBuffer,
    shards: usize,
}

impl Mapping {
    fn new(map: MmapRaw, shards: usize) -> Mapping {
        // SAFETY: the map stays mapped as long as `bytes`, which lives in
        // the same struct and is dropped with it.
        let bytes = unsafe { DmaBuffer::from_raw_parts(map.as_mut_ptr(), map.len()) };
        Mapping { map, bytes, shards }
    }

    fn word64(&self, at: usize) -> &AtomicU64 {
        assert!(at + 8 <= self.map.len() && at.is_multiple_of(8));
        // SAFETY: in bounds and aligned (checked; the map is page-aligned),
        // and only ever accessed atomically, by every process.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(at).cast()) }
    }

    fn word32(&self, at: usize) -> &AtomicU32 {
        assert!(at + 4 <= self.map.len() && at.is_multiple_of(4));
        // SAFETY: as in `word64`.
        unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(at).cast()) }
    }

    fn header(&self) -> &FileHeader {
        assert!(self.map.len() >= FILE_HEADER);
        // SAFETY: in bounds (checked), aligned (the map is page-aligned),
        // and every field atomic: it is only ever accessed atomically, by
        // every process.
        unsafe { &*self.map.as_mut_ptr().cast::<FileHeader>() }
    }

    fn ring_header(&self, shard: usize) -> &RingHeader {
        let at = self.ring(shard);
        assert!(at + RING_HEADER <= self.map.len());
        // SAFETY: as in `header`; a ring starts on a 64-byte boundary.
        unsafe { &*self.map.as_mut_ptr().add(at).cast::<RingHeader>() }
    }

    fn ring(&self, shard: usize) -> usize {
        FILE_HEADER + shard * ring_len()
    }

    fn slot(&self, shard: usize, pos: u64) -> usize {
        self.ring(shard) + RING_HEADER + (pos % u64::from(SLOTS)) as usize * SLOT_SIZE
    }

    fn tail(&self, shard: usize) -> &AtomicU64 {
        &self.ring_header(shard).tail
    }

    fn sleeping(&self, shard: usize) -> &AtomicU64 {
        &self.ring_header(shard).sleeping
    }
}

/// One shard's ring of a mapped inbox, for the index protocol.
struct RingView<'a> {
    mapping: &'a Mapping,
    shard: usize,
}

impl Ring for RingView<'_> {
    type W = AtomicU64;

    fn slots(&self) -> u64 {
        u64::from(SLOTS)
    }

    fn tail(&self) -> &AtomicU64 {
        self.mapping.tail(self.shard)
    }

    fn seq(&self, pos: u64) -> &AtomicU64 {
        self.mapping.word64(self.mapping.slot(self.shard, pos) + S_SEQ)
    }
}

/// A device's inbox: it creates it, consumes its rings, and removes it.
pub struct Inbox {
    path: PathBuf,
    scope: Scope,
    mapping: Mapping,
    /// Each ring's doorbell: what a producer rings to wake its sleeping
    /// consumer.
    bells: Box<[UnixDatagram]>,
    /// Held open with a shared lock for the inbox's life: a sender that
    /// can take the lock exclusively knows the device is gone (it may have
    /// crashed and left the file behind).
    _alive: std::fs::File,
}

/// Whether some process still holds `file`'s inbox lock.
fn held(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let free = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if free {
        // SAFETY: as above.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
    }
    !free
}

/// Removes this user's inboxes that no live device holds: those of
/// devices that died (a killed daemon's, a program's that exited without
/// closing its device). Returns how many it removed.
pub fn remove_abandoned_inboxes() -> usize {
    let Ok(entries) = inbox_dir().and_then(std::fs::read_dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let is_inbox = entry.file_name().to_str().is_some_and(is_inbox_name);
        let abandoned = is_inbox && open_inbox(&entry.path()).is_ok_and(|file| !held(&file));
        if abandoned && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
            for shard in 0..crate::MAX_SHARDS {
                let _ = std::fs::remove_file(bell_path(&entry.path(), shard));
            }
        }
    }
    removed
}

/// Whether `name` is one [`Scope::inbox_path`] gives.
fn is_inbox_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("netns").or_else(|| name.strip_prefix("switch")) else { return false };
    rest.split_once('-').is_some_and(|(id, addr)| id.parse::<u64>().is_ok() && addr.parse::<IpAddr>().is_ok())
}

/// Why the shared-memory wire could not start.
pub fn unavailable(e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("cannot create the shared-memory inbox: {e}"))
}

impl Inbox {
    /// Creates the inbox of a device on `addr` with `shards` shards in
    /// `scope`, replacing one a crashed device left behind; refused while
    /// another device of the scope has that address.
    pub fn create(addr: IpAddr, shards: usize, scope: Scope) -> io::Result<Inbox> {
        let path = scope.inbox_path(&inbox_dir().map_err(unavailable)?, addr);
        if open_inbox(&path).is_ok_and(|old| held(&old)) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another device on {addr} already has the shared-memory inbox {}", path.display()),
            ));
        }
        // A fresh file, so senders holding the old one's mapping see it
        // closed rather than a reused ring.
        let _ = std::fs::remove_file(&path);
        // `create_new` (O_EXCL) neither follows a symlink nor opens a file
        // someone else made meanwhile.
        let file =
            OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path).map_err(unavailable)?;
        file.set_len(file_len(shards) as u64).map_err(unavailable)?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_SH) } != 0 {
            return Err(unavailable(io::Error::last_os_error()));
        }
        let map = MmapRaw::map_raw(&file).map_err(unavailable)?;
        let mapping = Mapping::new(map, shards);
        let bells = (0..shards)
            .map(|shard| {
                let bell = bell_path(&path, shard);
                // A crashed device's bell is in the way; a live one's
                // inbox would have refused us above.
                let _ = std::fs::remove_file(&bell);
                let socket = UnixDatagram::bind(&bell)?;
                socket.set_nonblocking(true)?;
                Ok(socket)
            })
            .collect::<io::Result<Box<[_]>>>()
            .map_err(unavailable)?;
        for shard in 0..shards {
            for pos in 0..u64::from(SLOTS) {
                mapping.word64(mapping.slot(shard, pos) + S_SEQ).store(pos, Ordering::Relaxed);
            }
        }
        let header = mapping.header();
        header.version.store(VERSION, Ordering::Relaxed);
        header.shards.store(shards as u32, Ordering::Relaxed);
        header.slots.store(SLOTS, Ordering::Relaxed);
        header.slot_size.store(SLOT_SIZE as u32, Ordering::Relaxed);
        header.pid_namespace.store(this_pid_namespace(), Ordering::Relaxed);
        // Published last: a sender that sees the magic sees a whole inbox.
        header.magic.store(MAGIC, Ordering::Release);
        Ok(Inbox { path, scope, mapping, bells, _alive: file })
    }

    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// The consumer's side of shard `shard`'s ring.
    pub fn ring(self: &Arc<Self>, shard: usize) -> InboxRing {
        InboxRing { inbox: self.clone(), shard, head: 0, stuck_since: None, empty_looks: 0 }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        // Senders that still map it see it closed and go back to UDP.
        self.mapping.header().magic.store(0, Ordering::Release);
        let _ = std::fs::remove_file(&self.path);
        for shard in 0..self.bells.len() {
            let _ = std::fs::remove_file(bell_path(&self.path, shard));
        }
    }
}

/// One shard's ring of an inbox, as its consumer sees it.
pub struct InboxRing {
    inbox: Arc<Inbox>,
    shard: usize,
    /// The next position to read: the consumer's own, never shared.
    head: u64,
    /// Since when the slot at `head` has been claimed but not published.
    stuck_since: Option<Instant>,
    /// Looks that found the ring empty, for [`Self::looks_stuck`].
    empty_looks: u32,
}

impl InboxRing {
    /// The devices the ring's device reaches through shared memory.
    pub fn scope(&self) -> Scope {
        self.inbox.scope()
    }

    /// Takes up to `max` datagrams in order, copying each into `buf` and
    /// handing it to `deliver`; returns how many were taken. Entries that
    /// are malformed are skipped and counted in `malformed`.
    pub fn receive(
        &mut self,
        max: usize,
        buf: &mut [u8],
        malformed: &mut u64,
        deliver: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> usize {
        let inbox = self.inbox.clone();
        let m = &inbox.mapping;
        let ring = RingView { mapping: m, shard: self.shard };
        let mut taken = 0;
        while taken < max {
            match ring::peek(&ring, self.head) {
                Head::Ready => {}
                Head::NotPublished if !self.looks_stuck(&ring) => break,
                stuck @ (Head::NotPublished | Head::Corrupt) => {
                    // Claimed and not published yet, or written wrong by a
                    // broken peer. Either would stall the ring forever:
                    // give up on the slot after a while (a late producer
                    // then finds its publication refused, and the
                    // transport retransmits).
                    let since = *self.stuck_since.get_or_insert_with(Instant::now);
                    if since.elapsed() < ABANDONED_AFTER {
                        break;
                    }
                    if stuck == Head::Corrupt {
                        ring::release(&ring, self.head);
                    } else if !ring::abandon(&ring, self.head) {
                        continue; // published after all: read it
                    }
                    *malformed += 1;
                    self.advance();
                    continue;
                }
            }
            let slot = m.slot(self.shard, self.head);
            let len = m.word32(slot + S_LEN).load(Ordering::Relaxed) as usize;
            let source = read_source(m, slot);
            if len <= MAX_DATAGRAM_LEN.min(buf.len())
                && let Some(source) = source
            {
                m.bytes.read(slot + SLOT_DATA, &mut buf[..len]);
                softrnic_account::add(softrnic_account::Cost::BytesCopied, len as u64);
                deliver(source, &buf[..len]);
            } else {
                *malformed += 1;
            }
            ring::release(&ring, self.head);
            self.advance();
            taken += 1;
        }
        taken
    }

    /// Whether the slot at the head, not published, has been claimed:
    /// asked on the first of every [`LOOKS_PER_TAIL_READ`] looks at an
    /// empty ring (and on every look once a claim has been seen), because
    /// the answer is in the tail every producer's claim writes.
    fn looks_stuck(&mut self, ring: &RingView) -> bool {
        if self.stuck_since.is_none() {
            let look = self.empty_looks;
            self.empty_looks = look.wrapping_add(1);
            if !look.is_multiple_of(LOOKS_PER_TAIL_READ) {
                return false;
            }
        }
        ring::claimed(ring, self.head)
    }

    fn advance(&mut self) {
        self.head = self.head.wrapping_add(1);
        self.stuck_since = None;
    }

    /// Whether a datagram waits at the head of the ring (no system call).
    pub fn has_arrivals(&self) -> bool {
        let ring = RingView { mapping: &self.inbox.mapping, shard: self.shard };
        ring::peek(&ring, self.head) == Head::Ready
    }

    /// Before blocking: asks producers to ring the doorbell. Returns false
    /// (and asks nothing) if a datagram arrived meanwhile.
    pub fn prepare_to_sleep(&self) -> bool {
        let m = &self.inbox.mapping;
        wakeup::request(m.sleeping(self.shard), 1);
        if m.tail(self.shard).load(Ordering::Acquire) != self.head {
            wakeup::withdraw(m.sleeping(self.shard));
            return false;
        }
        true
    }

    /// After waking: withdraws the request and silences the doorbell.
    pub fn awake(&self) {
        wakeup::withdraw(self.inbox.mapping.sleeping(self.shard));
        let mut rung = [0u8; 8];
        while self.bell().recv(&mut rung).is_ok() {}
    }

    /// What the consumer blocks on, beside its UDP socket.
    pub fn doorbell(&self) -> RawFd {
        self.bell().as_raw_fd()
    }

    fn bell(&self) -> &UnixDatagram {
        &self.inbox.bells[self.shard]
    }
}

fn read_source(m: &Mapping, slot: usize) -> Option<SocketAddr> {
    let mut raw = [0u8; 16];
    m.bytes.read(slot + S_ADDR, &mut raw);
    let mut meta = [0u8; 4];
    m.bytes.read(slot + S_PORT, &mut meta);
    let port = u16::from_ne_bytes([meta[0], meta[1]]);
    let ip = match meta[2] {
        4 => IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3])),
        6 => IpAddr::V6(Ipv6Addr::from(raw)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

fn write_source(m: &Mapping, slot: usize, source: SocketAddr) {
    let (family, raw) = match source.ip() {
        IpAddr::V4(v4) => {
            let mut raw = [0u8; 16];
            raw[..4].copy_from_slice(&v4.octets());
            (4u8, raw)
        }
        IpAddr::V6(v6) => (6u8, v6.octets()),
    };
    m.bytes.write(slot + S_ADDR, &raw);
    let port = source.port().to_ne_bytes();
    m.bytes.write(slot + S_PORT, &[port[0], port[1], family, 0]);
}

/// A peer's inbox, as a sender maps it.
struct PeerInbox {
    mapping: Mapping,
    /// Whether its owner is in this process's PID namespace
    /// ([`FileHeader::pid_namespace`]).
    sees_our_processes: bool,
    file: std::fs::File,
    path: PathBuf,
    /// A socket connected to each ring's doorbell, once first rung
    /// (`None`: it could not be, and the bell stays silent).
    bells: Box<[OnceLock<Option<UnixDatagram>>]>,
}

/// What a producer's attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// In the ring.
    Delivered,
    /// In the ring, and its consumer slept: its doorbell was rung.
    DeliveredRang,
    /// The ring is full: nothing was written (the sender holds it, or
    /// drops it past its bound).
    Full,
}

impl PeerInbox {
    fn open(scope: Scope, dir: &Path, addr: IpAddr) -> Option<PeerInbox> {
        let path = scope.inbox_path(dir, addr);
        let file = open_inbox(&path).ok()?;
        if !is_own_private_file(&file) {
            return None;
        }
        let len = file.metadata().ok()?.len() as usize;
        if len < FILE_HEADER {
            return None;
        }
        if !held(&file) {
            return None; // left behind by a device that is gone
        }
        let map = MmapRaw::map_raw(&file).ok()?;
        let probe = Mapping::new(map, 0);
        // Check everything a broken peer could have written wrong.
        let header = probe.header();
        let shards = header.shards.load(Ordering::Relaxed) as usize;
        let valid = header.magic.load(Ordering::Acquire) == MAGIC
            && header.version.load(Ordering::Relaxed) == VERSION
            && (1..=crate::MAX_SHARDS).contains(&shards)
            && header.slots.load(Ordering::Relaxed) == SLOTS
            && header.slot_size.load(Ordering::Relaxed) as usize == SLOT_SIZE
            && len >= file_len(shards);
        let ours = this_pid_namespace();
        let sees_our_processes = ours != 0 && header.pid_namespace.load(Ordering::Relaxed) == ours;
        let bells = (0..shards).map(|_| OnceLock::new()).collect();
        valid.then(|| PeerInbox { mapping: Mapping { shards, ..probe }, sees_our_processes, file, path, bells })
    }

    /// Whether its device still runs (at `now`): it closed the inbox
    /// neither cleanly nor by dying.
    fn open_still(&self, checked_at: &mut Instant, now: Instant) -> bool {
        if self.mapping.header().magic.load(Ordering::Acquire) != MAGIC {
            return false;
        }
        if now.saturating_duration_since(*checked_at) >= RECHECK {
            *checked_at = now;
            return held(&self.file);
        }
        true
    }

    /// Puts one datagram from `source` into the ring of the shard that
    /// owns its destination QP.
    fn push(&self, source: SocketAddr, datagram: &[u8]) -> Sent {
        let m = &self.mapping;
        let shard = softrnic_transport::dest_qpn(datagram).map_or(0, |qpn| shard_of(qpn, m.shards));
        let ring = RingView { mapping: m, shard };
        let Some(pos) = ring::claim(&ring) else {
            return Sent::Full;
        };
        let slot = m.slot(shard, pos);
        let len = datagram.len().min(MAX_DATAGRAM_LEN);
        m.bytes.write(slot + SLOT_DATA, &datagram[..len]);
        softrnic_account::add(softrnic_account::Cost::BytesCopied, len as u64);
        m.word32(slot + S_LEN).store(len as u32, Ordering::Relaxed);
        write_source(m, slot, source);
        // Refused only if the consumer gave the slot up meanwhile.
        if !ring::publish(&ring, pos) {
            return Sent::Full;
        }
        if wakeup::requested(m.sleeping(shard)) != 0 && wakeup::take(m.sleeping(shard)) != 0 {
            self.ring_bell(shard);
            Sent::DeliveredRang
        } else {
            Sent::Delivered
        }
    }

    /// Wakes the consumer of shard `shard`'s ring. A bell that will not
    /// ring (its device going away, its socket's queue full of rings not
    /// yet heard) needs no second: the consumer has work to wake for, or
    /// none to miss.
    fn ring_bell(&self, shard: usize) {
        softrnic_account::one(softrnic_account::Cost::Doorbells);
        let bell = self.bells[shard].get_or_init(|| {
            let socket = UnixDatagram::unbound().ok()?;
            socket.set_nonblocking(true).ok()?;
            socket.connect(bell_path(&self.path, shard)).ok()?;
            Some(socket)
        });
        if let Some(bell) = bell {
            let _ = bell.send(&[1]);
        }
    }
}

/// A shard's view of the peers' inboxes: which addresses are local, and
/// their mapped rings.
pub struct Peers {
    /// Whose devices are this shard's local peers: its own device's scope,
    /// whichever thread drives the shard.
    scope: Scope,
    /// This user's [`inbox_dir`]; `None` if it is unusable (then every
    /// peer is reached over UDP).
    dir: Option<PathBuf>,
    known: FxHashMap<IpAddr, Peer>,
    /// The time what was found is judged stale by: the datapath's last
    /// poll ([`Peers::at`]), not a clock read per datagram (a third of
    /// the sender's time in a 64 KiB `write_bw` went to reading the clock
    /// here, on a VM).
    now: Instant,
}

enum Peer {
    /// Its inbox, and when the device behind it was last seen alive.
    Local(PeerInbox, Instant),
    /// No inbox when last looked.
    Remote(Instant),
}

impl Peers {
    pub fn new(scope: Scope) -> Peers {
        Peers { scope, dir: inbox_dir().ok(), known: FxHashMap::default(), now: Instant::now() }
    }

    /// Moves the time staleness is judged by to `now` (the datapath calls
    /// it once per poll).
    pub fn at(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    /// Sends `datagram` from `source` to `dst` through shared memory if
    /// `dst` is a device on this host; `None` if it is not.
    pub fn send(&mut self, source: SocketAddr, dst: IpAddr, datagram: &[u8]) -> Option<Sent> {
        Some(self.inbox(dst)?.push(source, datagram))
    }

    /// If `dst` is a device on this host (in this scope), whether its
    /// process sees this one's (one PID namespace): it can then open the
    /// memory files a reference names. `None`: not a device on this host.
    /// One lookup, for every datagram's egress.
    pub fn on_this_host(&mut self, dst: IpAddr) -> Option<bool> {
        self.inbox(dst).map(|inbox| inbox.sees_our_processes)
    }

    /// `dst`'s inbox, if it is a device on this host (looked for again
    /// once what was found is stale).
    fn inbox(&mut self, dst: IpAddr) -> Option<&PeerInbox> {
        let now = self.now;
        let stale = match self.known.get_mut(&dst) {
            Some(Peer::Local(inbox, checked_at)) => !inbox.open_still(checked_at, now),
            Some(Peer::Remote(at)) => now.saturating_duration_since(*at) >= RECHECK,
            None => true,
        };
        if stale {
            let found = self.dir.as_deref().and_then(|dir| PeerInbox::open(self.scope, dir, dst));
            let peer = match found {
                Some(inbox) => Peer::Local(inbox, now),
                None => Peer::Remote(now),
            };
            self.known.insert(dst, peer);
        }
        match self.known.get(&dst) {
            Some(Peer::Local(inbox, _)) => Some(inbox),
            _ => None,
        }
    }
}

/// What the fuzz targets drive (`fuzz/fuzz_targets/shm_inbox.rs`).
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use super::*;

    /// Writes `scribble` over an inbox's first ring (its header, then its
    /// slots), as a broken or hostile peer could, and lets the consumer
    /// read it twice, the second time after an abandoned slot is given
    /// up on. Returns how many datagrams it delivered; every one is
    /// checked to fit a datagram. The inbox is made once and made whole
    /// again after each input.
    pub fn consume_scribbled(scribble: &[u8]) -> usize {
        static INBOX: std::sync::OnceLock<Arc<Inbox>> = std::sync::OnceLock::new();
        let inbox = INBOX.get_or_init(|| {
            let scope = Scope::Switch(u32::MAX - std::process::id());
            Arc::new(Inbox::create("127.0.99.1".parse().expect("an address"), 1, scope).expect("an inbox"))
        });
        let m = &inbox.mapping;
        let ring = m.ring(0);
        let len = scribble.len().min(ring_len());
        m.bytes.write(ring, &scribble[..len]);
        let mut buf = vec![0u8; MAX_DATAGRAM_LEN];
        let (mut delivered, mut malformed) = (0, 0);
        let mut deliver = |_: SocketAddr, datagram: &[u8]| {
            assert!(datagram.len() <= MAX_DATAGRAM_LEN);
            delivered += 1;
        };
        let mut consumer = inbox.ring(0);
        consumer.receive(SLOTS as usize, &mut buf, &mut malformed, &mut deliver);
        consumer.stuck_since = consumer.stuck_since.map(|_| Instant::now() - ABANDONED_AFTER);
        consumer.receive(SLOTS as usize, &mut buf, &mut malformed, &mut deliver);
        // Whole again for the next input: every slot free, nothing claimed.
        m.tail(0).store(0, Ordering::Relaxed);
        m.sleeping(0).store(0, Ordering::Relaxed);
        for pos in 0..u64::from(SLOTS) {
            m.word64(m.slot(0, pos) + S_SEQ).store(pos, Ordering::Relaxed);
        }
        delivered
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Taken by the tests that leave an abandoned inbox behind on purpose,
    /// so that the sweep of one does not take the other's.
    static ABANDONING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn here() -> Scope {
        Scope::this_netns().unwrap()
    }

    /// Whether `fd` has something to read, without waiting.
    pub(crate) fn readable(fd: RawFd) -> bool {
        let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, ours, for the length of the call.
        unsafe { libc::poll(&mut poll, 1, 0) == 1 }
    }

    fn datagram(qpn: u32, fill: u8, len: usize) -> Vec<u8> {
        let mut d = vec![fill; len];
        d[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        d
    }

    #[test]
    fn datagrams_reach_the_ring_of_their_qps_shard_in_order() {
        let addr: IpAddr = "127.0.9.1".parse().unwrap();
        let inbox = Arc::new(Inbox::create(addr, 2, here()).unwrap());
        let mut peers = Peers::new(here());
        let source: SocketAddr = "127.0.9.2:4791".parse().unwrap();
        for i in 0..10u8 {
            let sent = peers.send(source, addr, &datagram(0x11 + u32::from(i % 2), i, 100 + usize::from(i)));
            assert_eq!(sent, Some(Sent::Delivered));
        }
        let mut buf = vec![0u8; MAX_DATAGRAM_LEN];
        let mut malformed = 0;
        for (shard, first) in [(1usize, 0u8), (0, 1)] {
            let mut ring = inbox.ring(shard);
            let mut got = Vec::new();
            ring.receive(64, &mut buf, &mut malformed, &mut |from, d| {
                assert_eq!(from, source);
                got.push((d[8], d.len()));
            });
            let expected: Vec<(u8, usize)> =
                (0..5).map(|k| (first + 2 * k, 100 + usize::from(first + 2 * k))).collect();
            assert_eq!(got, expected, "shard {shard}");
        }
        assert_eq!(malformed, 0);
        assert_eq!(peers.send(source, "127.0.9.3".parse().unwrap(), &datagram(0x11, 0, 20)), None, "no inbox");
        drop(inbox);
        assert_eq!(peers.send(source, addr, &datagram(0x11, 0, 20)), None, "a closed inbox is not used");
    }

    /// A peer in another PID namespace (a container that shares the
    /// network namespace and `/dev/shm` but not the processes) is reached
    /// through its ring, but cannot open this device's memory files: no
    /// references go to it.
    #[test]
    fn references_go_only_to_peers_that_see_our_processes() {
        let addr: IpAddr = "127.0.9.16".parse().unwrap();
        let inbox = Inbox::create(addr, 1, here()).unwrap();
        assert_eq!(Peers::new(here()).on_this_host(addr), Some(true), "a device of this process");
        inbox.mapping.header().pid_namespace.store(this_pid_namespace() ^ 1, Ordering::Relaxed);
        let mut peers = Peers::new(here());
        assert_eq!(peers.on_this_host(addr), Some(false), "another PID namespace's");
        assert_eq!(peers.on_this_host("127.0.9.17".parse().unwrap()), None, "no device there");
    }

    #[test]
    fn a_switch_reaches_its_own_devices_and_each_address_once() {
        let addr: IpAddr = "127.0.9.12".parse().unwrap();
        let source: SocketAddr = "127.0.9.13:4791".parse().unwrap();
        // A pid no daemon of these tests has.
        let switch = Scope::Switch(u32::MAX - std::process::id());
        let inbox = Inbox::create(addr, 1, switch).unwrap();
        assert_eq!(Peers::new(switch).send(source, addr, &datagram(0x11, 0, 20)), Some(Sent::Delivered));
        assert_eq!(Peers::new(here()).send(source, addr, &datagram(0x11, 0, 20)), None, "not the namespace's");
        let twin = Inbox::create(addr, 1, switch).err().expect("a second device on the address");
        assert_eq!(twin.kind(), io::ErrorKind::AddrInUse);
        assert!(Inbox::create(addr, 1, here()).is_ok(), "the namespace's wire is another");
        drop(inbox);
        assert!(Inbox::create(addr, 1, switch).is_ok(), "free again once the first closed");
    }

    #[test]
    fn only_abandoned_inboxes_are_swept() {
        let _alone = ABANDONING.lock().unwrap_or_else(|e| e.into_inner());
        let (live, dead): (IpAddr, IpAddr) = ("127.0.9.14".parse().unwrap(), "127.0.9.15".parse().unwrap());
        let switch = Scope::Switch(u32::MAX - 1 - std::process::id());
        let kept = Inbox::create(live, 1, switch).unwrap();
        let gone = Inbox::create(dead, 1, switch).unwrap();
        let path = gone.path.clone();
        // SAFETY: as in an_inbox_left_by_a_dead_device_is_not_used.
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&gone._alive), libc::LOCK_UN) };
        std::mem::forget(gone);
        assert!(remove_abandoned_inboxes() >= 1);
        assert!(!path.exists(), "the dead device's inbox is removed");
        assert!(kept.path.exists(), "the live one's stays");
        assert!(is_inbox_name("netns4026531840-10.0.0.1") && is_inbox_name("switch42-fe80::1"));
        assert!(!is_inbox_name("softrnic-mr") && !is_inbox_name("switch-10.0.0.1"));
    }

    #[test]
    fn a_broken_peer_ring_does_not_keep_a_sender_spinning() {
        let addr: IpAddr = "127.0.9.10".parse().unwrap();
        let inbox = Inbox::create(addr, 1, here()).unwrap();
        let m = &inbox.mapping;
        // Every sequence number ahead of the tail: no slot is ever free.
        for pos in 0..u64::from(SLOTS) {
            m.word64(m.slot(0, pos) + S_SEQ).store(pos + 7, Ordering::Relaxed);
        }
        let source: SocketAddr = "127.0.9.11:4791".parse().unwrap();
        assert_eq!(Peers::new(here()).send(source, addr, &datagram(0x11, 0, 20)), Some(Sent::Full));
    }

    #[test]
    fn an_inbox_left_by_a_dead_device_is_not_used() {
        let _alone = ABANDONING.lock().unwrap_or_else(|e| e.into_inner());
        let addr: IpAddr = "127.0.9.8".parse().unwrap();
        // What a crash leaves: the file, its magic, and no lock holder.
        let inbox = Inbox::create(addr, 1, here()).unwrap();
        let path = inbox.path.clone();
        // SAFETY: the lock's descriptor belongs to the inbox, which is
        // forgotten below and never closes it again.
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&inbox._alive), libc::LOCK_UN) };
        std::mem::forget(inbox);
        assert!(path.exists());
        let source: SocketAddr = "127.0.9.9:4791".parse().unwrap();
        assert_eq!(Peers::new(here()).send(source, addr, &datagram(0x11, 0, 20)), None);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_full_ring_refuses_and_a_sleeping_consumer_is_woken() {
        let addr: IpAddr = "127.0.9.4".parse().unwrap();
        let inbox = Arc::new(Inbox::create(addr, 1, here()).unwrap());
        let mut peers = Peers::new(here());
        let source: SocketAddr = "127.0.9.5:4791".parse().unwrap();
        let mut ring = inbox.ring(0);
        assert!(!ring.has_arrivals());
        assert!(ring.prepare_to_sleep());
        assert!(!readable(ring.doorbell()), "silent until rung");
        assert_eq!(peers.send(source, addr, &datagram(0x11, 1, 64)), Some(Sent::DeliveredRang));
        assert!(readable(ring.doorbell()), "the sleeper's doorbell rang");
        assert_eq!(peers.send(source, addr, &datagram(0x11, 2, 64)), Some(Sent::Delivered), "woken once");
        ring.awake();
        assert!(!readable(ring.doorbell()), "silenced on waking");
        assert!(!ring.prepare_to_sleep(), "work is waiting");
        for _ in 2..SLOTS {
            assert_eq!(peers.send(source, addr, &datagram(0x11, 3, 64)), Some(Sent::Delivered));
        }
        assert_eq!(peers.send(source, addr, &datagram(0x11, 4, 64)), Some(Sent::Full));
        let mut buf = vec![0u8; MAX_DATAGRAM_LEN];
        let mut malformed = 0;
        assert!(ring.has_arrivals());
        let n = ring.receive(usize::MAX, &mut buf, &mut malformed, &mut |_, _| {});
        assert_eq!((n, malformed), (SLOTS as usize, 0));
        assert!(!ring.has_arrivals());
        assert_eq!(peers.send(source, addr, &datagram(0x11, 5, 64)), Some(Sent::Delivered), "room again");
    }

    /// A consumer looking at its empty ring reads only the head's slot;
    /// the tail, which every producer's claim writes, once in
    /// `LOOKS_PER_TAIL_READ` looks.
    #[test]
    fn an_empty_ring_reads_the_tail_once_in_many_looks() {
        let addr: IpAddr = "127.0.9.8".parse().unwrap();
        let inbox = Arc::new(Inbox::create(addr, 1, here()).unwrap());
        let mut ring = inbox.ring(0);
        let mut buf = vec![0u8; MAX_DATAGRAM_LEN];
        let mut malformed = 0;
        let mut look = |ring: &mut InboxRing| ring.receive(8, &mut buf, &mut malformed, &mut |_, _| {});
        assert_eq!(look(&mut ring), 0);
        // A producer claims slot 0 and never publishes it.
        inbox.mapping.tail(0).store(1, Ordering::Release);
        for _ in 1..LOOKS_PER_TAIL_READ {
            assert_eq!(look(&mut ring), 0);
            assert!(ring.stuck_since.is_none(), "the tail is not read on these looks");
        }
        assert_eq!(look(&mut ring), 0);
        assert!(ring.stuck_since.is_some(), "the claim is seen on the next round's first look");
    }

    #[test]
    fn hostile_entries_are_skipped_and_an_abandoned_slot_does_not_stall_the_ring() {
        let addr: IpAddr = "127.0.9.6".parse().unwrap();
        let inbox = Arc::new(Inbox::create(addr, 1, here()).unwrap());
        let m = &inbox.mapping;
        let source: SocketAddr = "127.0.9.7:4791".parse().unwrap();
        // Slot 0: published with a length past the slot.
        m.word32(m.slot(0, 0) + S_LEN).store(1 << 30, Ordering::Relaxed);
        m.word64(m.slot(0, 0) + S_SEQ).store(1, Ordering::Release);
        // Slot 1: claimed by a producer that never publishes.
        m.tail(0).store(2, Ordering::Release);
        let mut peers = Peers::new(here());
        assert_eq!(peers.send(source, addr, &datagram(0x11, 9, 64)), Some(Sent::Delivered));
        let mut ring = inbox.ring(0);
        let mut buf = vec![0u8; MAX_DATAGRAM_LEN];
        let mut malformed = 0;
        let mut got = Vec::new();
        let mut got_more = Vec::new();
        ring.receive(8, &mut buf, &mut malformed, &mut |_, d| got.push(d[8]));
        assert_eq!((got.len(), malformed), (0, 1), "the bad entry is dropped; the claimed slot waits");
        std::thread::sleep(ABANDONED_AFTER + Duration::from_millis(5));
        ring.receive(8, &mut buf, &mut malformed, &mut |_, d| got.push(d[8]));
        assert_eq!((got, malformed), (vec![9], 2), "the abandoned slot is given up, then the next datagram");
        // Slot 3: a sequence number no producer writes.
        m.word64(m.slot(0, 3) + S_SEQ).store(0xdead, Ordering::Release);
        m.tail(0).store(4, Ordering::Release);
        ring.receive(8, &mut buf, &mut malformed, &mut |_, _| {});
        std::thread::sleep(ABANDONED_AFTER + Duration::from_millis(5));
        ring.receive(8, &mut buf, &mut malformed, &mut |_, _| {});
        assert_eq!(malformed, 3, "skipped after a while");
        assert_eq!(peers.send(source, addr, &datagram(0x11, 10, 64)), Some(Sent::Delivered));
        ring.receive(8, &mut buf, &mut malformed, &mut |_, d| got_more.push(d[8]));
        assert_eq!(got_more, vec![10], "the ring goes on");
    }

    /// What another user (or a broken program) could leave for a sender:
    /// an inbox others may write, a symlink to a live inbox, an inbox owned
    /// by someone else. Each is passed over for UDP, as if no peer were
    /// there; before, a sender wrote its datagrams into any of them.
    #[test]
    fn an_inbox_not_private_to_this_user_is_never_used() {
        let source: SocketAddr = "127.0.9.17:4791".parse().unwrap();
        let reaches = |addr: IpAddr| Peers::new(here()).send(source, addr, &datagram(0x11, 0, 20)).is_some();
        let addr: IpAddr = "127.0.9.16".parse().unwrap();
        let inbox = Inbox::create(addr, 1, here()).unwrap();
        assert!(reaches(addr), "a private inbox of this user's is used");
        let dir = inbox.path.parent().unwrap();
        let dir_meta = std::fs::symlink_metadata(dir).unwrap();
        assert!(dir_meta.is_dir() && dir_meta.mode() & 0o777 == 0o700, "the directory is private");

        std::fs::set_permissions(&inbox.path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(!reaches(addr), "an inbox anyone may write is not used");
        std::fs::set_permissions(&inbox.path, std::fs::Permissions::from_mode(0o600)).unwrap();

        let alias: IpAddr = "127.0.9.18".parse().unwrap();
        let link = here().inbox_path(dir, alias);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&inbox.path, &link).unwrap();
        assert!(!reaches(alias), "a symlink to a live inbox is not followed");
        std::fs::remove_file(&link).unwrap();

        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&inbox.path, Some(65534), None).unwrap();
            assert!(!reaches(addr), "another user's inbox is not used");
        } else {
            assert!(!crate::environment::under_ci(), "CI runs as root and must check the owner");
            eprintln!("the owner check skipped: giving a file to another user needs root");
        }
    }
}
