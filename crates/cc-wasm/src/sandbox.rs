//! Loading a module and running one QP's instance of it.

use std::mem::offset_of;
use std::path::Path as FsPath;
use std::sync::Arc;

use softrnic_cc::guest::{ABI_VERSION, Io, MESSAGE_MAX, PARAMS_MAX};
use softrnic_cc::{CongestionControl, Control, Dcqcn, Event, IntHop, MAX_HOPS, Path};
use softrnic_transport::congestion::{Algorithm, AlgorithmSpec};
use wasmtime::{
    Config, Engine, Instance, Memory, Module, Store, StoreLimits, StoreLimitsBuilder, TypedFunc, WasmFeatures,
};

/// Fuel one event may burn: a few thousand instructions, fifty times what
/// DCQCN needs; a loop runs out of it in microseconds.
pub const FUEL_PER_EVENT: u64 = 100_000;
/// Fuel for building a QP's state: parsing parameters costs more than
/// any event, once.
pub const FUEL_FOR_INIT: u64 = 10_000_000;
/// Linear memory one instance may have: 64 pages (a Rust module starts
/// with 17: a 1 MiB stack and its statics). It is also all the address
/// space an instance reserves (wasmtime's default is 4 GiB and a guard,
/// per instance, and every QP has one).
pub const MEMORY_LIMIT: usize = 64 * 64 * 1024;
/// Entries one instance's tables may hold: a Rust module's table of
/// functions called indirectly has tens.
pub const TABLE_LIMIT: usize = 10_000;
/// The largest module compiled: 35 times a Rust DCQCN (30 KiB).
pub const MODULE_LIMIT: usize = 1 << 20;

/// What a module may use and reserve: fuel metering; only the proposals
/// a module built for wasm32-unknown-unknown uses (no threads or shared
/// memory, SIMD, GC, exceptions, tail calls, 64-bit or several memories,
/// stack switching or components: less for a hostile module to reach);
/// and an address-space reservation of [`MEMORY_LIMIT`], with bounds
/// checked by the code rather than by guard pages.
fn sandbox_config() -> Config {
    let unneeded = WasmFeatures::THREADS
        | WasmFeatures::SHARED_EVERYTHING_THREADS
        | WasmFeatures::SIMD
        | WasmFeatures::RELAXED_SIMD
        | WasmFeatures::GC
        | WasmFeatures::GC_TYPES
        | WasmFeatures::FUNCTION_REFERENCES
        | WasmFeatures::EXCEPTIONS
        | WasmFeatures::LEGACY_EXCEPTIONS
        | WasmFeatures::TAIL_CALL
        | WasmFeatures::MEMORY64
        | WasmFeatures::MULTI_MEMORY
        | WasmFeatures::STACK_SWITCHING
        | WasmFeatures::CUSTOM_PAGE_SIZES
        | WasmFeatures::WIDE_ARITHMETIC
        | WasmFeatures::COMPONENT_MODEL;
    let mut config = Config::new();
    config
        .consume_fuel(true)
        .wasm_features(unneeded, false)
        .memory_reservation(MEMORY_LIMIT as u64)
        .memory_reservation_for_growth(0)
        .memory_guard_size(0);
    config
}

/// The exports the interface needs, with their types, for the error that
/// names what is missing.
const EXPORTS: &[(&str, &str)] = &[
    ("memory", "a memory"),
    ("softrnic_cc_abi", "a function () -> i32"),
    ("softrnic_cc_io", "a function () -> i32"),
    ("softrnic_cc_init", "a function () -> i32"),
    ("softrnic_cc_on_event", "a function () -> ()"),
];

/// A compiled module with its parameters: what a device keeps to give
/// each new QP an instance.
#[derive(Clone)]
pub struct WasmAlgorithm {
    name: String,
    params: String,
    /// The module as it came, for another process to compile
    /// ([`Algorithm::spec`]).
    bytes: Arc<[u8]>,
    engine: Engine,
    module: Module,
}

impl std::fmt::Debug for WasmAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmAlgorithm").field("name", &self.name).field("params", &self.params).finish()
    }
}

impl WasmAlgorithm {
    /// Reads and compiles the module at `path`, checks its interface and
    /// builds one instance with `params`, so that a bad module or a bad
    /// parameter is a one-line error now rather than a QP that falls back
    /// later.
    pub fn load(path: &FsPath, params: &str) -> Result<WasmAlgorithm, String> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| format!("{name}: {e}"))?;
        WasmAlgorithm::from_bytes(&name, &bytes, params)
    }

    /// As [`WasmAlgorithm::load`], from the module's bytes.
    pub fn from_bytes(name: &str, bytes: &[u8], params: &str) -> Result<WasmAlgorithm, String> {
        let fail = |what: String| format!("{name}: {what}");
        if params.len() > PARAMS_MAX {
            return Err(fail(format!("parameters longer than {PARAMS_MAX} bytes")));
        }
        if bytes.len() > MODULE_LIMIT {
            return Err(fail(format!("{} bytes; a module may have {MODULE_LIMIT} at most", bytes.len())));
        }
        let engine = Engine::new(&sandbox_config()).map_err(|e| fail(e.to_string()))?;
        let module =
            Module::new(&engine, bytes).map_err(|e| fail(format!("not a WebAssembly module softrnic can run: {e}")))?;
        if let Some(import) = module.imports().next() {
            return Err(fail(format!(
                "imports {}::{}; a congestion-control module may import nothing",
                import.module(),
                import.name()
            )));
        }
        for (export, kind) in EXPORTS {
            if module.get_export(export).is_none() {
                return Err(fail(format!(
                    "does not export `{export}` ({kind}); build it with softrnic_cc::export_algorithm!"
                )));
            }
        }
        let algorithm = WasmAlgorithm {
            name: name.to_string(),
            params: params.to_string(),
            bytes: Arc::from(bytes),
            engine,
            module,
        };
        let nominal = Path { line_rate_bps: 100_000_000_000, base_rtt_ns: 10_000, mtu: 4096 };
        algorithm.instantiate(&nominal).map_err(fail)?;
        Ok(algorithm)
    }

    pub fn params(&self) -> &str {
        &self.params
    }

    /// A fresh instance for a QP on `path`, initialised.
    fn instantiate(&self, path: &Path) -> Result<Instance_, String> {
        let limits = StoreLimitsBuilder::new()
            .memory_size(MEMORY_LIMIT)
            .table_elements(TABLE_LIMIT)
            .instances(1)
            .tables(1)
            .memories(1)
            .build();
        let mut store = Store::new(&self.engine, limits);
        store.limiter(|limits| limits);
        store.set_fuel(FUEL_PER_EVENT).map_err(|e| e.to_string())?;
        let instance = Instance::new(&mut store, &self.module, &[])
            .map_err(|e| format!("cannot start: {}", e.root_cause().to_string().lines().next().unwrap_or("")))?;
        let typed = |store: &mut Store<StoreLimits>, name: &str| {
            instance.get_typed_func::<(), u32>(&mut *store, name).map_err(|e| format!("`{name}`: {e}"))
        };
        let abi = typed(&mut store, "softrnic_cc_abi")?
            .call(&mut store, ())
            .map_err(|e| format!("`softrnic_cc_abi` {}", failure(&store, &e, FUEL_PER_EVENT)))?;
        if abi != ABI_VERSION {
            return Err(format!("speaks interface version {abi}; this softrnic speaks {ABI_VERSION}"));
        }
        let memory = instance.get_memory(&mut store, "memory").ok_or("exports no memory")?;
        let io = typed(&mut store, "softrnic_cc_io")?
            .call(&mut store, ())
            .map_err(|e| format!("`softrnic_cc_io` {}", failure(&store, &e, FUEL_PER_EVENT)))?
            as usize;
        if io.checked_add(size_of::<Io>()).is_none_or(|end| end > memory.data_size(&store)) {
            return Err("its I/O block lies outside its memory".to_string());
        }
        let init = typed(&mut store, "softrnic_cc_init")?;
        let on_event = instance
            .get_typed_func::<(), ()>(&mut store, "softrnic_cc_on_event")
            .map_err(|e| format!("`softrnic_cc_on_event`: {e}"))?;
        let mut me = Instance_ { store, memory, io, on_event };
        me.put_u64(offset_of!(Io, path) + offset_of!(Path, line_rate_bps), path.line_rate_bps);
        me.put_u64(offset_of!(Io, path) + offset_of!(Path, base_rtt_ns), path.base_rtt_ns);
        me.put_u64(offset_of!(Io, path) + offset_of!(Path, mtu), path.mtu);
        me.put_bytes(offset_of!(Io, params), self.params.as_bytes());
        me.put_u32(offset_of!(Io, params_len), self.params.len() as u32);
        me.store.set_fuel(FUEL_FOR_INIT).map_err(|e| e.to_string())?;
        let status = init
            .call(&mut me.store, ())
            .map_err(|e| format!("`softrnic_cc_init` {}", failure(&me.store, &e, FUEL_FOR_INIT)))?;
        me.store.set_fuel(FUEL_PER_EVENT).map_err(|e| e.to_string())?;
        if status != 0 {
            let len = (me.get_u32(offset_of!(Io, message_len)) as usize).min(MESSAGE_MAX);
            let message = me.get_bytes(offset_of!(Io, message), len);
            return Err(String::from_utf8_lossy(&message).into_owned());
        }
        Ok(me)
    }
}

impl Algorithm for WasmAlgorithm {
    fn name(&self) -> &str {
        &self.name
    }

    fn spec(&self) -> AlgorithmSpec {
        AlgorithmSpec::Module { name: self.name.clone(), bytes: self.bytes.clone(), params: self.params.clone() }
    }

    fn build(&self, path: &Path) -> Box<dyn CongestionControl + Send> {
        match self.instantiate(path) {
            Ok(instance) => {
                let wants_int = instance.get_u32(offset_of!(Io, wants_int)) != 0;
                Box::new(Sandboxed {
                    name: Arc::from(self.name.as_str()),
                    path: *path,
                    instance: Some(instance),
                    fallback: None,
                    last: Control::line_rate(path),
                    wants_int,
                })
            }
            Err(e) => {
                // It started when it was loaded; a QP it fails for now
                // runs the native DCQCN instead.
                eprintln!("softrnic: congestion control {}: {e}; this QP runs dcqcn instead", self.name);
                Box::new(Sandboxed::fallen_back(&self.name, path, Control::line_rate(path)))
            }
        }
    }
}

/// One instance and the bits of the interface the host touches per event.
struct Instance_ {
    store: Store<StoreLimits>,
    memory: Memory,
    io: usize,
    on_event: TypedFunc<(), ()>,
}

impl Instance_ {
    fn put_bytes(&mut self, offset: usize, bytes: &[u8]) {
        let at = self.io + offset;
        self.memory.data_mut(&mut self.store)[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn put_u64(&mut self, offset: usize, value: u64) {
        self.put_bytes(offset, &value.to_le_bytes());
    }

    fn put_u32(&mut self, offset: usize, value: u32) {
        self.put_bytes(offset, &value.to_le_bytes());
    }

    fn get_bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        let at = self.io + offset;
        self.memory.data(&self.store)[at..at + len].to_vec()
    }

    fn get_u32(&self, offset: usize) -> u32 {
        let at = self.io + offset;
        u32::from_le_bytes(self.memory.data(&self.store)[at..at + 4].try_into().expect("4 bytes"))
    }

    /// Hands `event` to the module and takes its answer.
    fn call(&mut self, now: u64, event: &Event) -> Result<Control, String> {
        let mut io = Io::EMPTY;
        io.set_event(now, event);
        // One borrow of the memory for all the fields: each lookup of it
        // costs as much as the writes.
        let block = &mut self.memory.data_mut(&mut self.store)[self.io..self.io + size_of::<Io>()];
        let mut put = |offset: usize, bytes: &[u8]| block[offset..offset + bytes.len()].copy_from_slice(bytes);
        put(offset_of!(Io, now_ns), &io.now_ns.to_le_bytes());
        put(offset_of!(Io, kind), &io.kind.to_le_bytes());
        put(offset_of!(Io, count), &io.count.to_le_bytes());
        put(offset_of!(Io, a), &io.a.to_le_bytes());
        put(offset_of!(Io, b), &io.b.to_le_bytes());
        put(offset_of!(Io, c), &io.c.to_le_bytes());
        if let Event::Int { hops } = event {
            for (i, hop) in hops.iter().take(MAX_HOPS).enumerate() {
                let at = offset_of!(Io, hops) + i * size_of::<IntHop>();
                put(at + offset_of!(IntHop, rate_bps), &hop.rate_bps.to_le_bytes());
                put(at + offset_of!(IntHop, timestamp_ns), &hop.timestamp_ns.to_le_bytes());
                put(at + offset_of!(IntHop, tx_bytes), &hop.tx_bytes.to_le_bytes());
                put(at + offset_of!(IntHop, queue_bytes), &hop.queue_bytes.to_le_bytes());
            }
        }
        self.store.set_fuel(FUEL_PER_EVENT).map_err(|e| e.to_string())?;
        self.on_event.call(&mut self.store, ()).map_err(|e| failure(&self.store, &e, FUEL_PER_EVENT))?;
        let block = &self.memory.data(&self.store)[self.io..self.io + size_of::<Io>()];
        let get = |offset: usize| u64::from_le_bytes(block[offset..offset + 8].try_into().expect("8 bytes"));
        let control = offset_of!(Io, control);
        Ok(Control {
            rate_bps: get(control + offset_of!(Control, rate_bps)),
            window_bytes: get(control + offset_of!(Control, window_bytes)),
            timer_at_ns: get(control + offset_of!(Control, timer_at_ns)),
        })
    }
}

/// Why a call into a module failed, in one line (wasmtime's own message
/// carries a backtrace over several).
fn failure(store: &Store<StoreLimits>, error: &wasmtime::Error, fuel: u64) -> String {
    match store.get_fuel() {
        Ok(0) => format!("ran out of fuel ({fuel} units)"),
        _ => format!("trapped: {}", error.root_cause().to_string().lines().next().unwrap_or("")),
    }
}

/// One QP's sandboxed algorithm, or the native DCQCN it fell back to.
pub struct Sandboxed {
    name: Arc<str>,
    path: Path,
    instance: Option<Instance_>,
    fallback: Option<Dcqcn>,
    /// The last answer the module gave that could be obeyed.
    last: Control,
    wants_int: bool,
}

impl Sandboxed {
    fn fallen_back(name: &str, path: &Path, last: Control) -> Sandboxed {
        let mut dcqcn = Dcqcn::with(softrnic_cc::dcqcn::DcqcnParams::default(), path);
        dcqcn.set_rate(last.rate_bps as f64);
        Sandboxed { name: Arc::from(name), path: *path, instance: None, fallback: Some(dcqcn), last, wants_int: false }
    }

    /// Whether the module was unloaded for this QP.
    pub fn fell_back(&self) -> bool {
        self.instance.is_none()
    }
}

impl CongestionControl for Sandboxed {
    fn on_event(&mut self, now: u64, event: &Event) -> Control {
        if let Some(instance) = &mut self.instance {
            let answer = instance.call(now, event).and_then(|control| {
                control.check(&self.path, now).map(|()| control).map_err(|nonsense| format!("answered {nonsense}"))
            });
            match answer {
                Ok(control) => {
                    self.last = control;
                    return control;
                }
                Err(e) => {
                    eprintln!(
                        "softrnic: congestion control {} {e}; unloaded for this QP, which runs dcqcn from {:.3} Gb/s",
                        self.name,
                        self.last.rate_bps as f64 / 1e9
                    );
                    *self = Sandboxed::fallen_back(&self.name, &self.path, self.last);
                }
            }
        }
        let dcqcn = self.fallback.as_mut().expect("a sandbox without an instance has fallen back");
        dcqcn.on_event(now, event)
    }

    fn wants_int(&self) -> bool {
        self.wants_int
    }
}
