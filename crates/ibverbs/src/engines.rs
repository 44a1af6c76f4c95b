//! One engine per process and address, shared by every context that opens
//! the device on it, as one NIC serves every context a process opens on
//! it: a program that opens the device twice (a server and a client side,
//! libfabric, Open MPI's one-sided component) gets two contexts on one
//! engine, where a second engine would find UDP port 4791 taken.
//!
//! Each context keeps its own objects and its own asynchronous-event
//! descriptor; the engine's events are routed to the context that owns the
//! QP, SRQ or CQ they name. The engine closes with its last context.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use softrnic_engine::Nic;
use softrnic_engine::engine::MAX_QUEUED_ASYNC_EVENTS;
use softrnic_event::EventQueue;
use softrnic_provider::DeviceEvent;
use softrnic_provider::provider::EngineHolder;
use softrnic_transport::AsyncEvent;

use crate::context::{Objects, translate};

/// A running engine and the contexts open on it.
pub struct Engine {
    nic: Nic,
    contexts: Mutex<Vec<Weak<ContextEvents>>>,
}

/// A context's hold on its engine: the engine, and where its events go.
/// Dropping it (the context closing) releases the engine, which stops with
/// its last context.
pub struct ContextEngine {
    engine: Option<Arc<Engine>>,
    events: Arc<ContextEvents>,
}

impl EngineHolder for ContextEngine {
    fn nic(&self) -> &Nic {
        &self.engine.as_ref().expect("held until dropped").nic
    }

    fn async_events(&self) -> &EventQueue<AsyncEvent> {
        &self.events.queue
    }
}

impl Drop for ContextEngine {
    /// Under the registry's lock, so that the last context's engine has
    /// stopped (and freed its port) before another open of the address
    /// can look.
    fn drop(&mut self) {
        let _engines = engines();
        if let Some(engine) = self.engine.take() {
            engine
                .contexts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|c| !std::ptr::eq(c.as_ptr(), Arc::as_ptr(&self.events)));
            drop(engine);
        }
    }
}

/// What of a context its engine's events need: the objects it owns, and
/// the queue behind its `async_fd`.
pub struct ContextEvents {
    pub queue: EventQueue<AsyncEvent>,
    pub objects: Mutex<Objects>,
}

impl ContextEvents {
    pub fn new() -> std::io::Result<Arc<ContextEvents>> {
        Ok(Arc::new(ContextEvents { queue: EventQueue::new()?, objects: Mutex::default() }))
    }

    pub fn objects(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The engines of this process, by address. A weak hold: a context owns
/// its engine, this map only finds it.
static ENGINES: LazyLock<Mutex<HashMap<IpAddr, Weak<Engine>>>> = LazyLock::new(Mutex::default);

fn engines() -> MutexGuard<'static, HashMap<IpAddr, Weak<Engine>>> {
    ENGINES.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new context's hold on the engine on `addr`: the running one, or one
/// `open` starts. Its events go to `events`.
pub fn attach<E>(
    addr: IpAddr,
    events: &Arc<ContextEvents>,
    open: impl FnOnce() -> Result<Nic, E>,
) -> Result<ContextEngine, E> {
    let mut engines = engines();
    let engine = match engines.get(&addr).and_then(Weak::upgrade) {
        Some(engine) => engine,
        None => {
            let engine = Arc::new(Engine { nic: open()?, contexts: Mutex::default() });
            let weak = Arc::downgrade(&engine);
            engine.nic.route_async_events(Box::new(move |event| {
                if let Some(engine) = weak.upgrade() {
                    engine.route(event);
                }
            }));
            engines.insert(addr, Arc::downgrade(&engine));
            engine
        }
    };
    engine.contexts.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::downgrade(events));
    Ok(ContextEngine { engine: Some(engine), events: events.clone() })
}

impl Engine {
    /// Delivers `event` to the context that owns its object; an event for
    /// an object no context has any more is dropped.
    fn route(&self, event: AsyncEvent) {
        let contexts: Vec<Arc<ContextEvents>> =
            self.contexts.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade).collect();
        if let Some(owner) = contexts.iter().find(|c| translate(&c.objects(), DeviceEvent::Object(event)).is_some()) {
            owner.queue.push_bounded(event, MAX_QUEUED_ASYNC_EVENTS);
        }
    }
}
