//! A lab's topology: switches, the hosts on them and the links between
//! them, from a small TOML file or a shape on the command line (`star:4`,
//! `dumbbell:2`, `leaf-spine:2x2x2`). It also works out each switch's
//! routes: shortest paths, and every equal one when `ecmp` is on.
//!
//! ```toml
//! ecmp = true                 # equal paths share traffic (default)
//! seed = 1                    # ECMP hashing and RED's coin
//!
//! [defaults]                  # every link, unless it says otherwise
//! rate = "10Gbps"             # bps, Kbps, Mbps, Gbps
//! queue = "512KB"             # one egress queue's limit (B, KB, MB, KiB, MiB)
//! ecn = { kmin = "40KB", kmax = "160KB", pmax = 0.2 }  # or "off"; default: HPCC's for the rate
//! pfc = { xoff = "256KB", xon = "128KB" }              # default: off (drop)
//! delay = "0us"               # ns, us, ms, s
//! loss = 0.0
//!
//! [[switch]]
//! name = "s0"
//! buffer = "4MB"              # the shared packet buffer (default 4MB)
//! aggregators = 20000         # in-network aggregation's pool (default: none)
//!
//! [[host]]
//! name = "h0"
//! switch = "s0"
//! rate = "1Gbps"              # any link key overrides the defaults
//!
//! [[link]]
//! between = ["leaf0", "spine0"]
//! rate = "40Gbps"
//! ```
//!
//! Host `i` (in file order) gets the address 10.77.0.`i+1`/16, and with
//! `addresses = N` (at most 16) also 10.77.`k`.`i+1` for k in 1..N: a host
//! that serves several softrnic processes gives each its own address, as
//! each softrnic device owns its address's UDP port 4791.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
pub use softrnic_switch::PortPeer;
use softrnic_switch::{
    AggregationConfig, Graph, LinkFaults, PfcConfig, PortConfig, QUEUES, RedConfig, Routes, SwitchConfig,
};
use toml::Spanned;

/// The largest aggregation pool (a slot index is 16 bits, one value
/// reserved).
pub const MAX_AGGREGATORS: usize = 65_535;

/// The most hosts a lab holds (one /24's worth of the lab's /16).
pub const MAX_HOSTS: usize = 250;

/// One link's properties, as the egress port that drives it sees them.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSpec {
    pub rate_bps: u64,
    pub queue: u64,
    pub ecn: Option<RedConfig>,
    pub pfc: Option<PfcConfig>,
    pub delay: Duration,
    pub loss: f64,
}

impl LinkSpec {
    pub fn port_config(&self) -> PortConfig {
        PortConfig {
            rate_bps: self.rate_bps,
            // A real switch is driven by a loop that the OS may delay: a
            // burst of two jumbo frames rides over that and keeps the rate.
            burst: 18_432,
            queue_limit: self.queue,
            red: self.ecn,
            pfc: self.pfc,
            faults: LinkFaults { loss: self.loss, delay: self.delay, ..LinkFaults::NONE },
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SwitchSpec {
    pub name: String,
    pub buffer: u64,
    /// In-network aggregation's pool; `None`: the switch does not
    /// aggregate.
    pub aggregation: Option<AggregationConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HostSpec {
    pub name: String,
    pub switch: usize,
    pub addr: Ipv4Addr,
    /// More addresses of the same host (10.77.k.i+1).
    pub aliases: Vec<Ipv4Addr>,
    pub link: LinkSpec,
}

impl HostSpec {
    /// Every address of the host, the primary first.
    pub fn addrs(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        std::iter::once(self.addr).chain(self.aliases.iter().copied())
    }

    /// Gives the host `n` addresses in all.
    pub fn set_addresses(&mut self, n: usize) {
        let last = self.addr.octets()[3];
        self.aliases = (1..n.min(MAX_ADDRESSES)).map(|k| Ipv4Addr::new(10, 77, k as u8, last)).collect();
    }
}

/// The most addresses one host has.
pub const MAX_ADDRESSES: usize = 16;

#[derive(Debug, Clone, PartialEq)]
pub struct SwitchLink {
    pub a: usize,
    pub b: usize,
    pub link: LinkSpec,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub switches: Vec<SwitchSpec>,
    pub hosts: Vec<HostSpec>,
    pub links: Vec<SwitchLink>,
    pub ecmp: bool,
    pub seed: u64,
}

// ---- the file ------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    ecmp: Option<bool>,
    seed: Option<u64>,
    #[serde(default)]
    defaults: LinkKeys,
    #[serde(default, rename = "switch")]
    switches: Vec<SwitchEntry>,
    #[serde(default, rename = "host")]
    hosts: Vec<HostEntry>,
    #[serde(default, rename = "link")]
    links: Vec<LinkEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchEntry {
    name: Spanned<String>,
    buffer: Option<Spanned<String>>,
    aggregators: Option<Spanned<usize>>,
}

/// Declares a table that takes the link keys beside its own, and
/// `link_keys` to take them out as [`LinkKeys`] (itself the table of the
/// link keys alone). serde's `flatten` would lose the spans that errors
/// name lines with.
macro_rules! with_link_keys {
    ($(#[$meta:meta])* $name:ident { $($field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct $name {
            $($field: $ty,)*
            rate: Option<Spanned<String>>,
            queue: Option<Spanned<String>>,
            ecn: Option<Spanned<toml::Value>>,
            pfc: Option<Spanned<toml::Value>>,
            delay: Option<Spanned<String>>,
            loss: Option<Spanned<f64>>,
        }

        impl $name {
            #[allow(dead_code, reason = "LinkKeys itself is read as it is")]
            fn link_keys(&self) -> LinkKeys {
                LinkKeys {
                    rate: self.rate.clone(),
                    queue: self.queue.clone(),
                    ecn: self.ecn.clone(),
                    pfc: self.pfc.clone(),
                    delay: self.delay.clone(),
                    loss: self.loss.clone(),
                }
            }
        }
    };
}

with_link_keys!(
    #[derive(Default)]
    LinkKeys {}
);
with_link_keys!(HostEntry { name: Spanned<String>, switch: Spanned<String>, addresses: Option<Spanned<u64>>, });
with_link_keys!(LinkEntry { between: Spanned<[String; 2]>, });

/// A one-line error that names the line: `topology.toml:7: ...`.
struct Located<'a> {
    path: &'a str,
    text: &'a str,
}

impl Located<'_> {
    fn at(&self, span: Range<usize>, message: impl std::fmt::Display) -> String {
        let line = self.text[..span.start.min(self.text.len())].matches('\n').count() + 1;
        format!("{}:{line}: {message}", self.path)
    }
}

impl Topology {
    /// Reads a topology file.
    pub fn load(path: &std::path::Path) -> Result<Topology, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Topology::parse(&path.display().to_string(), &text)
    }

    /// A topology from a file's text; `path` names it in errors.
    pub fn parse(path: &str, text: &str) -> Result<Topology, String> {
        let here = Located { path, text };
        let file: File = toml::from_str(text).map_err(|e| match e.span() {
            Some(span) => here.at(span, e.message().trim_end()),
            None => format!("{path}: {}", e.message().trim_end()),
        })?;
        let default_ecn = file.defaults.ecn.as_ref().map(|v| ecn(&here, v)).transpose()?;
        let defaults = link_spec(&here, &file.defaults, &LinkSpec::default(), default_ecn)?;
        let mut names: BTreeMap<String, Range<usize>> = BTreeMap::new();
        let mut unique = |name: &Spanned<String>, what: &str| -> Result<(), String> {
            check_name(&here, name, what)?;
            if let Some(first) = names.insert(name.get_ref().clone(), name.span()) {
                let first_line = text[..first.start].matches('\n').count() + 1;
                return Err(here.at(
                    name.span(),
                    format!(
                        "the name `{}` is already used on line {first_line}; give every host and switch its own",
                        name.get_ref()
                    ),
                ));
            }
            Ok(())
        };
        let mut switches = Vec::new();
        for entry in &file.switches {
            unique(&entry.name, "switch")?;
            let buffer = match &entry.buffer {
                Some(b) => size(&here, b)?,
                None => 4_000_000,
            };
            let aggregation = match &entry.aggregators {
                Some(n) if *n.get_ref() == 0 || *n.get_ref() > MAX_AGGREGATORS => {
                    return Err(here.at(
                        n.span(),
                        format!("aggregators = {}: give a pool of 1 to {MAX_AGGREGATORS}", n.get_ref()),
                    ));
                }
                Some(n) => Some(AggregationConfig::new(*n.get_ref())),
                None => None,
            };
            switches.push(SwitchSpec { name: entry.name.get_ref().clone(), buffer, aggregation });
        }
        let switch_index = |name: &Spanned<String>| -> Result<usize, String> {
            switches.iter().position(|s| &s.name == name.get_ref()).ok_or_else(|| {
                let known: Vec<&str> = switches.iter().map(|s| s.name.as_str()).collect();
                here.at(
                    name.span(),
                    format!(
                        "there is no switch `{}`; name one of [{}], or add a [[switch]] with that name",
                        name.get_ref(),
                        known.join(", ")
                    ),
                )
            })
        };
        let mut hosts = Vec::new();
        for (i, entry) in file.hosts.iter().enumerate() {
            unique(&entry.name, "host")?;
            if i >= MAX_HOSTS {
                return Err(here.at(entry.name.span(), format!("a lab holds at most {MAX_HOSTS} hosts")));
            }
            let switch = switch_index(&entry.switch)?;
            let link = link_spec(&here, &entry.link_keys(), &defaults, default_ecn)?;
            let mut host =
                HostSpec { name: entry.name.get_ref().clone(), switch, addr: host_addr(i), aliases: Vec::new(), link };
            if let Some(n) = &entry.addresses {
                if !(1..=MAX_ADDRESSES as u64).contains(n.get_ref()) {
                    return Err(here.at(n.span(), format!("addresses is a count from 1 to {MAX_ADDRESSES}")));
                }
                host.set_addresses(*n.get_ref() as usize);
            }
            hosts.push(host);
        }
        let mut links = Vec::new();
        for entry in &file.links {
            let [a, b] = entry.between.get_ref();
            let span = entry.between.span();
            let named = |n: &str| Spanned::new(span.clone(), n.to_string());
            let (a, b) = (switch_index(&named(a))?, switch_index(&named(b))?);
            if a == b {
                return Err(here.at(span, "a link joins two different switches; name two"));
            }
            links.push(SwitchLink { a, b, link: link_spec(&here, &entry.link_keys(), &defaults, default_ecn)? });
        }
        let topology =
            Topology { switches, hosts, links, ecmp: file.ecmp.unwrap_or(true), seed: file.seed.unwrap_or(1) };
        if topology.hosts.is_empty() {
            return Err(format!("{path}: no hosts; add a [[host]] with a name and a switch"));
        }
        let graph = topology.graph();
        if let Some(s) = graph.unreachable() {
            let (island, first) = (&topology.switches[s].name, &topology.switches[0].name);
            return Err(format!("{path}: switch `{island}` is not linked to `{first}`; add a [[link]] between them"));
        }
        if !topology.ecmp
            && let Some((a, b)) = graph.loop_link()
        {
            let i = topology.links.iter().position(|l| (l.a, l.b) == (a, b)).expect("a link of the graph");
            let (a, b) = (&topology.switches[a].name, &topology.switches[b].name);
            return Err(here.at(
                file.links[i].between.span(),
                format!("the link {a}-{b} closes a loop and ecmp = false: set ecmp = true, so equal paths share the traffic, or remove the link"),
            ));
        }
        Ok(topology)
    }

    /// A shape given on the command line: `star:N` (N hosts on one
    /// switch), `dumbbell:N` (N hosts on each of two switches joined by
    /// one link: the bottleneck), `leaf-spine:LxSxH` (L leaves, S spines,
    /// H hosts per leaf, every leaf linked to every spine). Every link
    /// gets `link`.
    pub fn shape(text: &str, link: LinkSpec) -> Result<Topology, String> {
        let (kind, arg) = text.split_once(':').unwrap_or((text, ""));
        let number = |s: &str| -> Result<usize, String> {
            s.parse::<usize>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| format!("`{text}`: `{s}` is not a count; write star:4, dumbbell:2 or leaf-spine:2x2x2"))
        };
        let mut t = Topology { switches: Vec::new(), hosts: Vec::new(), links: Vec::new(), ecmp: true, seed: 1 };
        let add_switch = |t: &mut Topology, name: String| {
            t.switches.push(SwitchSpec { name, buffer: 4_000_000, aggregation: None });
            t.switches.len() - 1
        };
        let add_host = |t: &mut Topology, switch: usize| {
            let i = t.hosts.len();
            t.hosts.push(HostSpec {
                name: format!("h{i}"),
                switch,
                addr: host_addr(i),
                aliases: Vec::new(),
                link: link.clone(),
            });
        };
        match kind {
            "star" => {
                let s = add_switch(&mut t, "s0".into());
                for _ in 0..number(arg)? {
                    add_host(&mut t, s);
                }
            }
            "dumbbell" => {
                let n = number(arg)?;
                let (left, right) = (add_switch(&mut t, "s0".into()), add_switch(&mut t, "s1".into()));
                for side in [left, right] {
                    for _ in 0..n {
                        add_host(&mut t, side);
                    }
                }
                t.links.push(SwitchLink { a: left, b: right, link: link.clone() });
            }
            "leaf-spine" => {
                let parts: Vec<&str> = arg.split('x').collect();
                let [l, s, h] = parts[..] else {
                    return Err(format!("`{text}`: write leaf-spine:LxSxH, e.g. leaf-spine:2x2x2"));
                };
                let (l, s, h) = (number(l)?, number(s)?, number(h)?);
                let leaves: Vec<usize> = (0..l).map(|i| add_switch(&mut t, format!("leaf{i}"))).collect();
                let spines: Vec<usize> = (0..s).map(|i| add_switch(&mut t, format!("spine{i}"))).collect();
                for &leaf in &leaves {
                    for _ in 0..h {
                        add_host(&mut t, leaf);
                    }
                    for &spine in &spines {
                        t.links.push(SwitchLink { a: leaf, b: spine, link: link.clone() });
                    }
                }
            }
            _ => {
                return Err(format!(
                    "`{text}` is not a topology; give a TOML file, star:N, dumbbell:N or leaf-spine:LxSxH"
                ));
            }
        }
        if t.hosts.len() > MAX_HOSTS {
            return Err(format!("`{text}` has {} hosts; a lab holds at most {MAX_HOSTS}", t.hosts.len()));
        }
        Ok(t)
    }

    /// The shape alone: which switch each host is on, and the links.
    pub fn graph(&self) -> Graph {
        Graph {
            switches: self.switches.len(),
            host_switch: self.hosts.iter().map(|h| h.switch).collect(),
            links: self.links.iter().map(|l| (l.a, l.b)).collect(),
        }
    }

    /// What each port of `switch` is joined to, in port order: its hosts
    /// first, then its links in file order.
    pub fn ports(&self, switch: usize) -> Vec<PortPeer> {
        self.graph().ports(switch)
    }

    /// The pipeline configuration and routes of `switch`.
    pub fn switch_config(&self, switch: usize) -> (SwitchConfig, Routes) {
        let ports = self
            .ports(switch)
            .into_iter()
            .map(|peer| match peer {
                PortPeer::Host(h) => self.hosts[h].link.port_config(),
                PortPeer::Switch { switch: other, .. } => {
                    let link =
                        self.links.iter().find(|l| (l.a, l.b) == (switch, other) || (l.b, l.a) == (switch, other));
                    link.expect("a port's link exists").link.port_config()
                }
            })
            .collect();
        let config = SwitchConfig {
            ports,
            queues_per_port: QUEUES,
            shared_buffer: self.switches[switch].buffer,
            seed: self.seed.wrapping_mul(0x9e37_79b9).wrapping_add(switch as u64),
            aggregation: self.switches[switch].aggregation,
        };
        let addrs: Vec<Vec<IpAddr>> = self.hosts.iter().map(|h| h.addrs().map(IpAddr::V4).collect()).collect();
        (config, self.graph().routes(switch, &addrs, self.ecmp))
    }

    pub fn host_index(&self, name: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.name == name)
    }
}

/// The address of host number `i`.
pub fn host_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, i as u8 + 1)
}

/// Names become shell variables, namespace and file names: letters,
/// digits and `_`, not starting with a digit.
fn check_name(here: &Located, name: &Spanned<String>, what: &str) -> Result<(), String> {
    let n = name.get_ref();
    let ok = !n.is_empty()
        && n.len() <= 32
        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !n.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(here.at(
            name.span(),
            format!(
                "`{n}` cannot name a {what}: use up to 32 letters, digits and _, starting with a letter (h0, leaf1)"
            ),
        ))
    }
}

/// A key's value, parsed, or `base` where the key is absent.
fn keyed<S, T>(
    key: &Option<Spanned<S>>,
    parse: impl FnOnce(&Spanned<S>) -> Result<T, String>,
    base: T,
) -> Result<T, String> {
    key.as_ref().map_or(Ok(base), parse)
}

/// The defaults' own ECN choice, if they make one: off, or fixed
/// thresholds. Without one, each link takes HPCC's for its rate.
type EcnChoice = Option<Option<RedConfig>>;

fn link_spec(here: &Located, keys: &LinkKeys, base: &LinkSpec, default_ecn: EcnChoice) -> Result<LinkSpec, String> {
    let rate_bps = keyed(&keys.rate, |r| rate(here, r), base.rate_bps)?;
    let queue = keyed(&keys.queue, |q| size(here, q), base.queue)?;
    let ecn = match (&keys.ecn, default_ecn) {
        (Some(v), _) => ecn(here, v)?,
        (None, Some(choice)) => choice,
        (None, None) => Some(RedConfig::for_rate(rate_bps)),
    };
    let pfc = keyed(&keys.pfc, |v| pfc(here, v), base.pfc)?;
    let delay = keyed(&keys.delay, |d| duration(here, d), base.delay)?;
    let loss = keyed(
        &keys.loss,
        |l| match *l.get_ref() {
            p if (0.0..=1.0).contains(&p) => Ok(p),
            _ => Err(here.at(l.span(), "loss is a probability: write a number from 0.0 to 1.0")),
        },
        base.loss,
    )?;
    Ok(LinkSpec { rate_bps, queue, ecn, pfc, delay, loss })
}

fn ecn(here: &Located, value: &Spanned<toml::Value>) -> Result<Option<RedConfig>, String> {
    let bad = || here.at(value.span(), r#"ecn is "off" or { kmin = "40KB", kmax = "160KB", pmax = 0.2 }"#);
    match value.get_ref() {
        toml::Value::String(s) if s == "off" => Ok(None),
        toml::Value::Table(t) => {
            let get = |k: &str| t.get(k).ok_or_else(bad);
            let size_of = |v: &toml::Value| {
                v.as_str().ok_or_else(bad).and_then(|s| size(here, &Spanned::new(value.span(), s.to_string())))
            };
            let (kmin, kmax) = (size_of(get("kmin")?)?, size_of(get("kmax")?)?);
            let pmax = get("pmax")?.as_float().filter(|p| (0.0..=1.0).contains(p)).ok_or_else(bad)?;
            if t.len() != 3 || kmin > kmax {
                return Err(bad());
            }
            Ok(Some(RedConfig { kmin, kmax, pmax }))
        }
        _ => Err(bad()),
    }
}

fn pfc(here: &Located, value: &Spanned<toml::Value>) -> Result<Option<PfcConfig>, String> {
    let bad = || here.at(value.span(), r#"pfc is "off" or { xoff = "256KB", xon = "128KB" } with xon below xoff"#);
    match value.get_ref() {
        toml::Value::String(s) if s == "off" => Ok(None),
        toml::Value::Table(t) => {
            let size_of = |k: &str| {
                t.get(k)
                    .and_then(|v| v.as_str())
                    .ok_or_else(bad)
                    .and_then(|s| size(here, &Spanned::new(value.span(), s.to_string())))
            };
            let (xoff, xon) = (size_of("xoff")?, size_of("xon")?);
            if t.len() != 2 || xon >= xoff {
                return Err(bad());
            }
            Ok(Some(PfcConfig { xoff, xon }))
        }
        _ => Err(bad()),
    }
}

/// A number and a unit, each unit a multiplier.
fn with_unit(text: &str, units: &[(&str, f64)]) -> Option<f64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let (_, multiplier) = units.iter().find(|(u, _)| *u == unit.trim())?;
    Some(number * multiplier)
}

const RATE_UNITS: [(&str, f64); 5] = [("bps", 1.0), ("Kbps", 1e3), ("Mbps", 1e6), ("Gbps", 1e9), ("Tbps", 1e12)];
const SIZE_UNITS: [(&str, f64); 7] =
    [("B", 1.0), ("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("KiB", 1024.0), ("MiB", 1048576.0), ("GiB", 1073741824.0)];
const TIME_UNITS: [(&str, f64); 4] = [("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)];

/// `10Gbps`, `100Mbps`.
pub fn parse_rate(text: &str) -> Result<u64, String> {
    with_unit(text, &RATE_UNITS).filter(|&r| r >= 1e3).map(|r| r as u64).ok_or_else(|| {
        format!("`{text}` is not a rate: write a number and a unit, e.g. 10Gbps, 100Mbps (bps, Kbps, Mbps, Gbps, Tbps)")
    })
}

/// `512KB`, `4MiB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    with_unit(text, &SIZE_UNITS).map(|s| s as u64).ok_or_else(|| {
        format!("`{text}` is not a size: write a number and a unit, e.g. 512KB or 4MiB (B, KB, MB, KiB, MiB)")
    })
}

/// `10us`, `1ms`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    with_unit(text, &TIME_UNITS)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("`{text}` is not a time: write a number and a unit, e.g. 10us or 1ms (ns, us, ms, s)"))
}

fn rate(here: &Located, s: &Spanned<String>) -> Result<u64, String> {
    parse_rate(s.get_ref()).map_err(|e| here.at(s.span(), e))
}

fn size(here: &Located, s: &Spanned<String>) -> Result<u64, String> {
    parse_size(s.get_ref()).map_err(|e| here.at(s.span(), e))
}

fn duration(here: &Located, s: &Spanned<String>) -> Result<Duration, String> {
    parse_duration(s.get_ref()).map_err(|e| here.at(s.span(), e))
}

impl LinkSpec {
    /// A link at `rate_bps` whose queues hold `queue` bytes, with HPCC's
    /// ECN thresholds for the rate, no PFC, no delay, no loss.
    pub fn new(rate_bps: u64, queue: u64) -> LinkSpec {
        LinkSpec {
            rate_bps,
            queue,
            ecn: Some(RedConfig::for_rate(rate_bps)),
            pfc: None,
            delay: Duration::ZERO,
            loss: 0.0,
        }
    }
}

impl Default for LinkSpec {
    /// 10 Gb/s, 512 KB per queue, HPCC's ECN thresholds, no PFC.
    fn default() -> LinkSpec {
        LinkSpec::new(10_000_000_000, 512_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEAF_SPINE: &str = r#"
[defaults]
rate = "10Gbps"

[[switch]]
name = "leaf0"
[[switch]]
name = "leaf1"
[[switch]]
name = "spine0"
[[switch]]
name = "spine1"

[[host]]
name = "a"
switch = "leaf0"
[[host]]
name = "b"
switch = "leaf1"
rate = "1Gbps"

[[link]]
between = ["leaf0", "spine0"]
[[link]]
between = ["leaf0", "spine1"]
[[link]]
between = ["leaf1", "spine0"]
rate = "40Gbps"
[[link]]
between = ["leaf1", "spine1"]
"#;

    #[test]
    fn a_leaf_spine_file_routes_over_both_spines() {
        let t = Topology::parse("ls.toml", LEAF_SPINE).unwrap();
        assert_eq!(t.hosts[1].link.rate_bps, 1_000_000_000);
        assert_eq!(t.hosts[1].addr, Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(t.links[2].link.rate_bps, 40_000_000_000);
        assert_eq!(t.links[2].link.ecn, Some(RedConfig::for_rate(40_000_000_000)), "ECN follows each link's rate");
        // leaf0: port 0 to a, ports 1 and 2 to the spines.
        assert_eq!(t.ports(0)[0], PortPeer::Host(0));
        assert_eq!(t.ports(0)[1], PortPeer::Switch { switch: 2, port: 0 });
        let (config, routes) = t.switch_config(0);
        assert_eq!(config.ports.len(), 3);
        let b = IpAddr::V4(t.hosts[1].addr);
        let ports: std::collections::BTreeSet<usize> = (0..64).filter_map(|flow| routes.lookup(b, flow, 9)).collect();
        assert_eq!(ports, [1, 2].into(), "ECMP uses both spines");
        // A spine reaches b through leaf1 only.
        let (_, spine) = t.switch_config(2);
        assert_eq!(spine.lookup(b, 0, 0), Some(1));
    }

    #[test]
    fn shapes_build_their_topologies() {
        let star = Topology::shape("star:4", LinkSpec::default()).unwrap();
        assert_eq!((star.switches.len(), star.hosts.len(), star.links.len()), (1, 4, 0));
        let dumbbell = Topology::shape("dumbbell:2", LinkSpec::default()).unwrap();
        assert_eq!((dumbbell.switches.len(), dumbbell.hosts.len(), dumbbell.links.len()), (2, 4, 1));
        let ls = Topology::shape("leaf-spine:2x3x4", LinkSpec::default()).unwrap();
        assert_eq!((ls.switches.len(), ls.hosts.len(), ls.links.len()), (5, 8, 6));
        for bad in ["star", "star:0", "ring:3", "leaf-spine:2x2", "star:x"] {
            assert!(Topology::shape(bad, LinkSpec::default()).is_err(), "{bad}");
        }
    }

    /// Each mistake gets one line naming the line and what to write.
    #[test]
    fn bad_files_are_refused_with_the_line_and_the_fix() {
        let cases: [(&str, &str); 7] = [
            ("[[switch]]\nname = \"s0\"\ncolour = \"red\"\n", "t.toml:3: unknown field `colour`"),
            (
                "[[switch]]\nname = \"s0\"\n[[host]]\nname = \"h0\"\nswitch = \"s0\"\nrate = \"10\"\n",
                "t.toml:6: `10` is not a rate: write a number and a unit, e.g. 10Gbps",
            ),
            (
                "[[switch]]\nname = \"s0\"\n[[host]]\nname = \"h0\"\nswitch = \"s0\"\n[[host]]\nname = \"h0\"\nswitch = \"s0\"\n",
                "t.toml:7: the name `h0` is already used on line 4",
            ),
            (
                "[[switch]]\nname = \"s0\"\n[[host]]\nname = \"h0\"\nswitch = \"s9\"\n",
                "t.toml:5: there is no switch `s9`",
            ),
            (
                "[[switch]]\nname = \"s0\"\n[[host]]\nname = \"0h\"\nswitch = \"s0\"\n",
                "t.toml:4: `0h` cannot name a host",
            ),
            ("[[switch]]\nname = \"s0\"\n", "no hosts"),
            ("[defaults]\nqueue = \"1 parsec\"\n", "t.toml:2: `1 parsec` is not a size"),
        ];
        for (text, expected) in cases {
            let error = Topology::parse("t.toml", text).unwrap_err();
            assert!(error.starts_with(expected) || error.contains(expected), "{error:?} should say {expected:?}");
            assert!(!error.contains('\n'), "one line: {error:?}");
        }
    }

    #[test]
    fn a_loop_without_ecmp_is_refused_and_an_island_too() {
        let looped = LEAF_SPINE.replace("[defaults]", "ecmp = false\n[defaults]");
        let error = Topology::parse("ls.toml", &looped).unwrap_err();
        assert!(error.contains("closes a loop and ecmp = false") && error.starts_with("ls.toml:"), "{error}");
        let island = "[[switch]]\nname = \"s0\"\n[[switch]]\nname = \"s1\"\n[[host]]\nname = \"h\"\nswitch = \"s0\"\n";
        assert!(Topology::parse("t", island).unwrap_err().contains("switch `s1` is not linked to `s0`"));
    }

    #[test]
    fn units() {
        assert_eq!(parse_rate("2.5Gbps"), Ok(2_500_000_000));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_duration("10us"), Ok(Duration::from_micros(10)));
        assert!(parse_rate("10GB").is_err());
    }
}
