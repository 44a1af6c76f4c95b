//! The offloaded stack's designs (E4, E5): how softrnicd, an engine on
//! cores of its own that sends and receives on programs' behalf, moves a
//! payload between a program's memory and the wire.
//!
//! Transmit (`softrnicd --tx`):
//! - `header-only`: the engine builds the headers and gathers the payload
//!   straight from the program's memory into the packet; the daemon's own
//!   memory holds only headers.
//! - `bulk-copy`: the command processor first copies each payload whole
//!   into a staging buffer of the daemon's, one copy per gather entry (a
//!   DMA engine's bulk copy), and the engine sends from there.
//! - `engine-copy`: the engine itself pulls each payload into a staging
//!   buffer with an RDMA READ through a QP of the daemon's connected to
//!   itself ([`copy_engine`]), as the original's DPU pulls it across
//!   PCIe, and sends it from there once the READ completes.
//!
//! Receive (`softrnicd --rx`):
//! - `direct`: the engine scatters each payload straight into the buffers
//!   the program posted.
//! - `per-connection`: each QP has a ring of staging buffers of its own,
//!   one for each receive the program may post, used in turn; the payload
//!   lands there and is copied into the program's buffer when it completes.
//!   The buffers the engine writes grow with the connections.
//! - `in-cache`: every QP of the daemon draws from one pool of
//!   [`IN_CACHE_BUFFERS`] recycled buffers, the most recently freed first,
//!   and a receive takes its buffer only when a message arrives for it
//!   (the engine fetches it on demand, [`Moment::Arrival`]); the
//!   payload is copied on as it completes and the buffer goes back to the
//!   pool. So the buffers in use are the messages between arrival and
//!   copy, not the receives posted: the engine writes buffers that are
//!   still in cache, and the working set stays small however many
//!   connections there are and however many receives they post.
//!
//! A staging buffer is posted only for a receive the program posted, so a
//! sender still meets an RNR NAK where the program has none. Sends larger
//! than a buffer, READs, atomics and inline data go header-only; receives
//! larger than a buffer go direct; both are counted as passed through.
//! Staging buffers are registered for local access only: no key a peer
//! could learn reaches them.
//!
//! Apart from the designs, a QP may ask for the block offload ([`blocks`],
//! E7): its storage blocks' CRCs computed and checked here, and with a
//! store their payloads placed.
//!
//! Each copying design is a stage, a [`SendStage`] or a [`ReceiveStage`],
//! that a QP's command processor hands its new WQEs and its receives'
//! completions to. The default designs (`header-only`, `direct`) have
//! none: the processor then moves WQEs straight into the engine.

use std::sync::Arc;

use softrnic_daemon_protocol::block::BlockOffload;
use softrnic_engine::Nic;
use softrnic_transport::memory::MemoryTable;
use softrnic_transport::{Completion, PdId, RecvWorkRequest, Result, VerbsError};

use crate::server::processor::Sends;

pub mod blocks;
mod bulk_copy;
pub mod copy_engine;
mod counters;
mod engine_copy;
mod staged_receive;
mod staging;

use blocks::{BlockCounters, BlockSends, CheckedReceives, Placement, Store};
use bulk_copy::BulkCopy;
use copy_engine::CopyEngine;
pub use counters::{OffloadCounters, OffloadStats};
use engine_copy::EngineCopy;
pub use engine_copy::PULLS_PER_QP;
pub use staged_receive::IN_CACHE_BUFFERS;
use staged_receive::{Pool, StagedReceives};
pub use staging::SLOT;

/// How a send's payload reaches the engine (E4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TxDesign {
    /// Headers from the engine, the payload from the program's memory.
    #[default]
    HeaderOnly,
    /// Copied whole into the daemon's memory first.
    BulkCopy,
    /// Pulled into the daemon's memory by the engine's own RDMA READ.
    EngineCopy,
}

/// Where a receive's payload lands first (E5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RxDesign {
    /// In the program's buffer.
    #[default]
    Direct,
    /// In a ring of the QP's own, then copied.
    PerConnection,
    /// In a small pool shared by every QP, then copied while hot.
    InCache,
}

/// The names the flags take (`header-only`, `in-cache`).
macro_rules! display_as_flag {
    ($($design:ty),*) => {$(
        impl std::fmt::Display for $design {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let value = clap::ValueEnum::to_possible_value(self).expect("no design is hidden");
                f.write_str(value.get_name())
            }
        }
    )*};
}
display_as_flag!(TxDesign, RxDesign);

/// The daemon's designs, one of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Designs {
    pub tx: TxDesign,
    pub rx: RxDesign,
}

/// A copying transmit design's hold on one QP's sends, between the
/// program's send ring and the engine.
pub trait SendStage: Send {
    /// Moves the program's new sends from `sends` to the engine, staged as
    /// the design stages them, in the order posted. Returns whether it did
    /// any work, or has sends under way (the processor then keeps looking
    /// rather than sleep).
    fn move_sends(&mut self, sends: &mut Sends<'_>) -> bool;

    /// Frees what the stage holds: the QP is gone.
    fn release(self: Box<Self>, nic: &Nic);
}

/// Posts one receive to the engine's QP (the processor's `ibv_post_recv`,
/// or the engine's fetch on demand's).
pub type Post<'a> = dyn FnMut(RecvWorkRequest) -> Result<()> + 'a;

/// What a receive stage undoes in the engine once its lock is let go.
pub type Undo = Box<dyn FnOnce(&Nic) + Send>;

/// When a receive stage is asked to pass on the receives it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// The command processor's pass.
    Pass,
    /// A message found no receive: the engine's fetch on demand, with
    /// none of its locks held.
    Arrival,
    /// The QP is in the error state: every receive kept goes to the
    /// engine, where it flushes.
    Flush,
}

/// A copying receive design's hold on one QP's receives: it posts them to
/// the engine with staging buffers of its own, and turns their
/// completions back into the program's. Its lock is taken by the
/// processor and by the engine's fetch on demand, so while holding it a
/// stage calls into the engine only to post receives, which never waits
/// for a shard's pass.
pub trait ReceiveStage: Send {
    /// Takes a receive the program posted, in order: posted through `post`
    /// now, or kept. `OutOfResources` leaves it in the program's ring.
    fn take(&mut self, request: RecvWorkRequest, post: &mut Post<'_>) -> Result<()>;

    /// Whether the program's new receives are wanted at `moment` (read
    /// from its ring and handed to [`ReceiveStage::take`] first).
    fn wants_new_receives(&self, _moment: Moment) -> bool {
        true
    }

    /// Posts the kept receives that `moment` allows. Returns whether it
    /// posted any.
    fn settle(&mut self, moment: Moment, post: &mut Post<'_>) -> bool;

    /// Turns the engine's completion of a receive into the program's: its
    /// own `wr_id`, its payload copied into its buffers (checked against
    /// `memory`). Returns false when those fail their check: the
    /// completion then says so, as the engine's would, and the QP must
    /// move to the error state.
    fn complete(&mut self, completion: &mut Completion, memory: &MemoryTable) -> bool;

    /// RESET: the engine discarded the receives posted to it, and the kept
    /// ones go too.
    fn reset(&mut self);

    /// Frees what the stage holds: the QP is gone. The engine's side is
    /// undone by the caller once it has let the stage's lock go.
    fn release(&mut self) -> Undo;
}

/// A new QP's stages: none for the default designs.
#[derive(Default)]
pub struct Stages {
    pub send: Option<Box<dyn SendStage>>,
    pub receive: Option<Box<dyn ReceiveStage>>,
}

/// The designs and what they share: handed to every device.
pub struct Offload {
    pub designs: Designs,
    pub counters: Arc<OffloadCounters>,
    /// What the block offload did, for every QP that asked for it.
    pub blocks: Arc<BlockCounters>,
    /// The in-cache design's pool (allocated only for it).
    pool: Option<Arc<Pool>>,
}

impl Offload {
    pub fn new(designs: Designs) -> Offload {
        let counters = Arc::new(OffloadCounters::default());
        let pool = (designs.rx == RxDesign::InCache).then(|| Arc::new(Pool::new(&counters)));
        Offload { designs, counters, blocks: Arc::default(), pool }
    }

    /// The stages of a QP that asked for the block offload ([`blocks`]),
    /// in place of the daemon's designs: its sends' blocks checksummed, its
    /// receives' checked, and with a store placed.
    pub fn block_stages(
        &self,
        nic: &Nic,
        pd: PdId,
        (depth, recv_depth): (u32, Option<u32>),
        offload: BlockOffload,
    ) -> Result<Stages> {
        let Some(recv_depth) = recv_depth else {
            return Err(VerbsError::NotSupported(
                "the block offload checks the receives of a QP's own queue, not of an SRQ".into(),
            ));
        };
        let store = match offload {
            BlockOffload::Crc => None,
            BlockOffload::CrcAndPlacement { store } => Some(Store::new(nic, pd, store)?),
        };
        let send = BlockSends::new(nic, pd, depth, store, (&self.counters, &self.blocks))?;
        let receive: Result<Box<dyn ReceiveStage>> = match store {
            None => Ok(Box::new(CheckedReceives::new(pd, recv_depth, &self.blocks))),
            Some(store) => {
                let placement = Placement { store, counters: self.blocks.clone() };
                StagedReceives::placing(nic, pd, recv_depth, placement, &self.counters).map(|r| Box::new(r) as _)
            }
        };
        match receive {
            Ok(receive) => Ok(Stages { send: Some(Box::new(send)), receive: Some(receive) }),
            Err(e) => {
                Box::new(send).release(nic);
                Err(e)
            }
        }
    }

    /// The stages of a new QP of `pd` whose engine holds `depth` sends and
    /// `recv_depth` receives (`None`: it takes them from an SRQ, whose
    /// receives land directly), on a device with `copy` (for
    /// `engine-copy`).
    pub fn stages(
        &self,
        nic: &Nic,
        pd: PdId,
        (depth, recv_depth): (u32, Option<u32>),
        copy: Option<&Arc<CopyEngine>>,
    ) -> Result<Stages> {
        let counters = &self.counters;
        let send: Option<Box<dyn SendStage>> = match (self.designs.tx, copy) {
            (TxDesign::HeaderOnly, _) => None,
            (TxDesign::BulkCopy, _) => Some(Box::new(BulkCopy::new(nic, pd, depth, counters)?)),
            (TxDesign::EngineCopy, Some(engine)) => Some(Box::new(EngineCopy::new(nic, pd, depth, engine, counters)?)),
            (TxDesign::EngineCopy, None) => unreachable!("an engine-copy daemon opens each device's copy engine"),
        };
        let receive = match (self.designs.rx, &self.pool, recv_depth) {
            (_, _, None) | (RxDesign::Direct, _, _) => Ok(None),
            (RxDesign::PerConnection, _, Some(depth)) => StagedReceives::own(nic, pd, depth, counters).map(Some),
            (RxDesign::InCache, Some(pool), Some(depth)) => {
                StagedReceives::shared(nic, pd, depth, pool, counters).map(Some)
            }
            (RxDesign::InCache, None, _) => unreachable!("an in-cache daemon has its pool"),
        };
        match receive {
            Ok(receive) => Ok(Stages { send, receive: receive.map(|r| Box::new(r) as Box<dyn ReceiveStage>) }),
            Err(e) => {
                if let Some(send) = send {
                    send.release(nic);
                }
                Err(e)
            }
        }
    }
}
