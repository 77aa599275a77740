//! A decode replay on a mixture-of-experts GGUF (llama.cpp's layout:
//! `blk.N.ffn_{gate,up,down}_exps.weight` with `ne[2] = n_expert`), for
//! `benches/residency`: each token reads what a decode step reads (one row
//! of the token embedding, every layer's dense tensors, the routed experts'
//! slices of its expert tensors, the output matrix, which is the token
//! embedding where the model ties them) in the order of ggml's graph, with a
//! stand-in for the compute (a sum of every 8-byte word, which runs at the
//! memory's rate as a quantized matrix-vector product does, on `--threads`
//! threads that share each node's chunks in order, as ggml's do). The routing
//! is SYNTHETIC, from a seed: `uniform` (each token's `expert_used_count`
//! experts drawn uniformly) or `zipf` (a zipf law over a shuffled order per
//! layer, each slot keeping its previous token's expert half the time).
//!
//! `--mode plain` maps the file as llama.cpp does (normal advice, no
//! prefetch) and leaves every read to the page faults; `--mode announce`
//! loads with weightmap's defaults and announces, as a ggml runtime's hook
//! would: at each layer's start the next layer's dense tensors (the output
//! matrix after the last), and the routed experts once the router has
//! chosen them; `--mode defaults` loads as `announce` does and announces
//! nothing (what announcing costs where the weights fit). Every mode reads
//! the same bytes and prints the same checksum. `--guess P` (with
//! `announce`) adds a predictor of set accuracy: as each layer's dense node
//! starts, it guesses the layer's experts (`Weights::prefetch_likely`),
//! each right with probability P, and otherwise one the router did not
//! choose.
//!
//! With `--budget BYTES` (a memory cgroup's limit) it also prints the bytes
//! a cold run must read however it is cached, token by token
//! (`fixed_token_missed`, `lru_token_missed`), with the best fixed resident
//! set and with an LRU cache of slices, each holding the budget less
//! 64 MiB for the runtime and starting empty; `fixed_missed_per_token` is
//! the fixed set's as if it started full, as this replay gave it before.
//!
//! ```text
//! cargo run --release --example moe_replay -- FILE --mode announce --routing zipf --tokens 16
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::Instant;

use weightmap::{AccessAdvice, AdvicePolicy, LoadOptions, Need, Prefetch, Weights};

/// One tensor's part of a token's reads: all of it, one expert's slice, or
/// one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Part {
    Whole(usize),
    Expert(usize, u32),
    Row(usize, u64),
}

struct Layer {
    dense: Vec<usize>,
    experts: Vec<usize>,
}

struct Model {
    embd: usize,
    layers: Vec<Layer>,
    tail: Vec<usize>,
    n_expert: u32,
    n_used: u32,
}

struct Args {
    file: String,
    mode: String,
    routing: String,
    tokens: usize,
    seed: u64,
    threads: usize,
    budget: Option<u64>,
    guess: Option<f64>,
    json: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        file: String::new(),
        mode: "announce".into(),
        routing: "uniform".into(),
        tokens: 8,
        seed: 1,
        threads: 2,
        budget: None,
        guess: None,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--mode" => a.mode = value(),
            "--routing" => a.routing = value(),
            "--tokens" => a.tokens = value().parse().unwrap_or_else(|_| usage("--tokens")),
            "--seed" => a.seed = value().parse().unwrap_or_else(|_| usage("--seed")),
            "--threads" => a.threads = value().parse().unwrap_or_else(|_| usage("--threads")),
            "--budget" => a.budget = Some(value().parse().unwrap_or_else(|_| usage("--budget"))),
            "--guess" => a.guess = Some(value().parse().unwrap_or_else(|_| usage("--guess"))),
            "--json" => a.json = true,
            f if !f.starts_with('-') && a.file.is_empty() => a.file = f.to_owned(),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let known = ["plain", "defaults", "announce"].contains(&a.mode.as_str())
        && ["uniform", "zipf"].contains(&a.routing.as_str());
    let guess_ok = a
        .guess
        .map_or(true, |p| (0.0..=1.0).contains(&p) && a.mode == "announce");
    if a.file.is_empty() || !known || !guess_ok || a.tokens == 0 || a.threads == 0 {
        usage("FILE, --mode plain|defaults|announce, --routing uniform|zipf");
    }
    a
}

fn usage(why: &str) -> ! {
    eprintln!("moe_replay: {why}\nusage: moe_replay FILE [--mode plain|defaults|announce] [--routing uniform|zipf] [--tokens N] [--seed S] [--threads T] [--budget BYTES] [--guess ACCURACY] [--json]");
    std::process::exit(2)
}

fn model_of(w: &Weights) -> Model {
    let index = |name: &str| w.tensor_index(name);
    let need = |name: &str| index(name).unwrap_or_else(|| usage(&format!("no tensor {name}")));
    let md = w
        .gguf_metadata()
        .unwrap_or_else(|| usage("not a GGUF file"));
    let arch = md
        .get_str("general.architecture")
        .unwrap_or("llama")
        .to_owned();
    let n_used = md
        .get_u32(&format!("{arch}.expert_used_count"))
        .unwrap_or(8);
    let mut layers = Vec::new();
    while index(&format!("blk.{}.attn_norm.weight", layers.len())).is_some() {
        let prefix = format!("blk.{}.", layers.len());
        let mut layer = Layer {
            dense: Vec::new(),
            experts: Vec::new(),
        };
        for i in (0..w.len()).filter(|&i| w.tensor_at(i).unwrap().name().starts_with(&prefix)) {
            match w.tensor_at(i).unwrap().name().contains("_exps.") {
                true => layer.experts.push(i),
                false => layer.dense.push(i),
            }
        }
        // llama.cpp's graph computes the up projection, then the gate,
        // then the down (`build_moe_ffn`).
        let order = ["ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"];
        layer.experts.sort_by_key(|&i| {
            let name = w.tensor_at(i).unwrap().name();
            order
                .iter()
                .position(|o| name.contains(o))
                .unwrap_or(order.len())
        });
        layers.push(layer);
    }
    let n_expert = layers
        .iter()
        .flat_map(|l| &l.experts)
        .map(|&i| w.tensor_at(i).unwrap().info().experts())
        .max()
        .unwrap_or(0) as u32;
    // A model without `output.weight` (gemma's) ties its output to the
    // token embedding, which each token then reads whole.
    let embd = need("token_embd.weight");
    let tail = vec![
        need("output_norm.weight"),
        index("output.weight").unwrap_or(embd),
    ];
    Model {
        embd,
        layers,
        tail,
        n_expert,
        n_used: n_used.min(n_expert),
    }
}

/// splitmix64: the routing's and the token ids' randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Each token's experts, per layer: `[token][layer] -> ids`.
fn routing(m: &Model, a: &Args) -> Vec<Vec<Vec<u32>>> {
    let mut rng = Rng(a.seed);
    let (n, k) = (m.n_expert.max(1), m.n_used as usize);
    // zipf: a shuffled order per layer, and the law's cumulative weights.
    let orders: Vec<Vec<u32>> = (0..m.layers.len())
        .map(|_| {
            let mut o: Vec<u32> = (0..n).collect();
            for i in (1..o.len()).rev() {
                o.swap(i, rng.below(i as u64 + 1) as usize);
            }
            o
        })
        .collect();
    let weights: Vec<f64> = (1..=n).map(|r| 1.0 / f64::from(r)).collect();
    let total: f64 = weights.iter().sum();
    let draw_zipf = |rng: &mut Rng, layer: usize| {
        let mut u = rng.unit() * total;
        for (r, w) in weights.iter().enumerate() {
            if u < *w {
                return orders[layer][r];
            }
            u -= w;
        }
        orders[layer][n as usize - 1]
    };
    let draw = |rng: &mut Rng, layer: usize| match a.routing.as_str() {
        "zipf" => draw_zipf(rng, layer),
        _ => rng.below(u64::from(n)) as u32,
    };
    let mut tokens: Vec<Vec<Vec<u32>>> = Vec::with_capacity(a.tokens);
    for _ in 0..a.tokens {
        let mut layers = Vec::with_capacity(m.layers.len());
        let last_token = tokens.last();
        for l in 0..m.layers.len() {
            let previous = last_token.map(|p: &Vec<Vec<u32>>| &p[l]);
            let mut chosen: Vec<u32> = Vec::with_capacity(k);
            for slot in 0..k {
                // zipf's temporal locality: a slot keeps its expert half the time.
                let kept = previous
                    .filter(|_| a.routing == "zipf" && rng.unit() < 0.5)
                    .map(|p: &Vec<u32>| p[slot])
                    .filter(|e| !chosen.contains(e));
                let mut e = kept.unwrap_or_else(|| draw(&mut rng, l));
                while chosen.contains(&e) {
                    e = draw(&mut rng, l);
                }
                chosen.push(e);
            }
            layers.push(chosen);
        }
        tokens.push(layers);
    }
    tokens
}

/// The bytes of `part`.
fn bytes_of(w: &Weights, part: Part) -> &[u8] {
    let t = |i| w.tensor_at(i).unwrap();
    match part {
        Part::Whole(i) => t(i).host_bytes().unwrap(),
        Part::Row(i, r) => t(i).row(r).unwrap(),
        Part::Expert(i, e) => {
            let t = t(i);
            let info = t.info();
            let range = info.expert_range(u64::from(e)).unwrap();
            let start = (range.start - info.file_offset) as usize;
            &t.host_bytes().unwrap()[start..start + (range.end - range.start) as usize]
        }
    }
}

/// The sum of every 8-byte word of `bytes` (and of the bytes after the
/// last whole word), wrapping: the compute stand-in's work on one chunk.
fn sum_words(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let acc = words.by_ref().fold(0u64, |a, c| {
        a.wrapping_add(u64::from_le_bytes(c.try_into().unwrap()))
    });
    words
        .remainder()
        .iter()
        .fold(acc, |a, &b| a.wrapping_add(u64::from(b)))
}

/// The compute stand-in's threads, ggml's way: for each node, every thread
/// (the caller's and `threads - 1` workers) takes the node's next chunk
/// from a shared counter, so that together they go through its bytes in
/// order, and between nodes the workers wait by spinning, so that a node
/// costs no thread's start.
struct Pool<'a> {
    /// The node's bytes, in chunks, in order.
    chunks: RwLock<Vec<&'a [u8]>>,
    next: AtomicUsize,
    /// The workers' part of the node's sum.
    sum: AtomicU64,
    /// Workers still on the node.
    busy: AtomicUsize,
    /// Bumped for each node; the workers start on a change.
    node: AtomicU64,
    stop: AtomicBool,
    workers: usize,
}

/// The bytes a thread takes at a time, as one of ggml's chunks of rows.
const CHUNK: usize = 256 << 10;

impl<'a> Pool<'a> {
    fn new(threads: usize) -> Self {
        Pool {
            chunks: RwLock::new(Vec::new()),
            next: AtomicUsize::new(0),
            sum: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            node: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            workers: threads - 1,
        }
    }

    /// The chunks' sum, from whichever thread calls it.
    fn work(&self) -> u64 {
        let chunks = self.chunks.read().unwrap();
        let mut acc = 0u64;
        while let Some(c) = chunks.get(self.next.fetch_add(1, Ordering::Relaxed)) {
            acc = acc.wrapping_add(sum_words(c));
        }
        acc
    }

    fn wait_until(done: impl Fn() -> bool) {
        let mut spins = 0u32;
        while !done() {
            spins += 1;
            if spins < 1 << 10 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn worker(&self) {
        let mut seen = 0;
        loop {
            Self::wait_until(|| self.node.load(Ordering::Acquire) != seen);
            seen = self.node.load(Ordering::Acquire);
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            self.sum.fetch_add(self.work(), Ordering::Relaxed);
            self.busy.fetch_sub(1, Ordering::Release);
        }
    }

    /// The wrapping sum of every 8-byte word of `parts`' bytes, each cut
    /// into chunks.
    fn compute(&self, w: &'a Weights, parts: &[Part]) -> u64 {
        *self.chunks.write().unwrap() = parts
            .iter()
            .flat_map(|&p| bytes_of(w, p).chunks(CHUNK))
            .collect();
        self.next.store(0, Ordering::Relaxed);
        self.sum.store(0, Ordering::Relaxed);
        self.busy.store(self.workers, Ordering::Relaxed);
        self.node.fetch_add(1, Ordering::Release);
        let own = self.work();
        Self::wait_until(|| self.busy.load(Ordering::Acquire) == 0);
        own.wrapping_add(self.sum.load(Ordering::Relaxed))
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.node.fetch_add(1, Ordering::Release);
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

fn read_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("read_bytes: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// What each token reads, in order, as ggml's graph computes it: `[token]
/// -> steps`, one a node. A layer's experts are one step per expert tensor,
/// in llama.cpp's order (`build_moe_ffn`: up, gate, down), each reading its
/// routed experts in ascending order, as ggml's `mul_mat_id` goes through
/// them.
fn token_parts(m: &Model, w: &Weights, route: &[Vec<u32>], token_id: u64) -> Vec<Vec<Part>> {
    let rows = w.tensor_at(m.embd).unwrap().n_rows();
    let mut steps = vec![vec![Part::Row(m.embd, token_id % rows)]];
    for (l, layer) in m.layers.iter().enumerate() {
        steps.push(layer.dense.iter().map(|&i| Part::Whole(i)).collect());
        let mut experts = route[l].clone();
        experts.sort_unstable();
        for &i in &layer.experts {
            steps.push(experts.iter().map(|&e| Part::Expert(i, e)).collect());
        }
    }
    steps.push(m.tail.iter().map(|&i| Part::Whole(i)).collect());
    steps
}

/// Announce `parts` (the announce mode's hook), in their order.
fn announce(w: &Weights, parts: &[Part]) {
    announce_as(w, parts, Weights::prefetch);
}

/// Hand `parts` to `call` (`Weights::prefetch` or `prefetch_likely`) as
/// needs, each tensor's experts together, in their order.
fn announce_as(
    w: &Weights,
    parts: &[Part],
    call: fn(&Weights, &[Need<'_>]) -> weightmap::Result<()>,
) {
    let mut needs: Vec<(usize, Vec<i32>)> = Vec::new();
    for &p in parts {
        match p {
            Part::Whole(i) => needs.push((i, Vec::new())),
            Part::Expert(i, e) => match needs.last_mut() {
                Some((t, experts)) if *t == i && !experts.is_empty() => experts.push(e as i32),
                _ => needs.push((i, vec![e as i32])),
            },
            Part::Row(..) => {}
        }
    }
    let needs: Vec<Need> = needs.iter().map(|(i, e)| Need::experts(*i, e)).collect();
    call(w, &needs).expect("announcements of the file's own tensors");
}

fn size_of(w: &Weights, p: Part) -> u64 {
    bytes_of(w, p).len() as u64
}

/// What a cold run must read, token by token, with a cache of `capacity`
/// bytes, under the two policies of the physical limit.
struct Missed {
    /// The best fixed resident set, chosen with hindsight over every token:
    /// a part in it is read when first used, any other part on every use.
    fixed: Vec<u64>,
    /// An LRU cache of parts, in the order they are read.
    lru: Vec<u64>,
    /// The fixed set's bytes a token as if it started full, without its own
    /// first reads (the figure this replay gave before it gave `fixed`).
    fixed_warm_per_token: f64,
}

fn missed(w: &Weights, tokens: &[Vec<Vec<Part>>], capacity: u64) -> Missed {
    let resident = best_fixed_set(w, tokens, capacity);
    let mut read_once = std::collections::HashSet::new();
    let fixed: Vec<u64> = tokens
        .iter()
        .map(|steps| {
            let parts = steps.iter().flatten();
            let missed = parts.filter(|&&p| !resident.contains(&p) || read_once.insert(p));
            missed.map(|&p| size_of(w, p)).sum()
        })
        .collect();
    let first_reads: u64 = resident.iter().map(|&p| size_of(w, p)).sum();
    let cold: u64 = fixed.iter().sum();
    Missed {
        fixed,
        lru: lru_missed(w, tokens, capacity),
        fixed_warm_per_token: cold.saturating_sub(first_reads) as f64 / tokens.len() as f64,
    }
}

/// The parts used most over `tokens` (the smallest first among equals,
/// then in a fixed order), as many as `capacity` bytes hold.
fn best_fixed_set(
    w: &Weights,
    tokens: &[Vec<Vec<Part>>],
    capacity: u64,
) -> std::collections::HashSet<Part> {
    let mut count: HashMap<Part, u64> = HashMap::new();
    for p in tokens.iter().flatten().flatten() {
        *count.entry(*p).or_default() += 1;
    }
    let mut ranked: Vec<(Part, u64)> = count.into_iter().collect();
    ranked.sort_by_key(|&(p, c)| (std::cmp::Reverse(c), size_of(w, p), p));
    let mut held = 0u64;
    let fits = ranked.into_iter().filter(|&(p, _)| {
        let s = size_of(w, p);
        let fits = held + s <= capacity;
        held += if fits { s } else { 0 };
        fits
    });
    fits.map(|(p, _)| p).collect()
}

/// Each token's bytes an LRU cache of `capacity` bytes misses, over the
/// parts in the order they are read.
fn lru_missed(w: &Weights, tokens: &[Vec<Vec<Part>>], capacity: u64) -> Vec<u64> {
    let (mut lru, mut last_use, mut held, mut clock) = (
        std::collections::BTreeMap::new(),
        HashMap::new(),
        0u64,
        0u64,
    );
    let mut token_missed = |steps: &Vec<Vec<Part>>| {
        let mut token = 0;
        for &p in steps.iter().flatten() {
            clock += 1;
            let s = size_of(w, p);
            if let Some(t) = last_use.insert(p, clock) {
                lru.remove(&t);
            } else {
                token += s;
                held += s;
                while held > capacity {
                    let Some((_, old)) = lru.pop_first() else {
                        break;
                    };
                    last_use.remove(&old);
                    held -= size_of(w, old);
                }
            }
            lru.insert(clock, p);
        }
        token
    };
    tokens.iter().map(&mut token_missed).collect()
}

/// What a decode of every token measured.
struct Decoded {
    /// The compute's sum over every byte read.
    checksum: u64,
    /// Each token's time, and `/proc/self/io`'s read bytes after it.
    token_ms: Vec<f64>,
    token_read: Vec<u64>,
    /// Time in the expert nodes, tokens 2 to N: where a token waits for its
    /// routed experts' reads.
    expert_ms: f64,
    /// Time in the announcing calls, tokens 2 to N.
    announce_ms: f64,
}

fn is_experts(parts: &[Part]) -> bool {
    parts.iter().any(|p| matches!(p, Part::Expert(..)))
}

fn is_whole(parts: &[Part]) -> bool {
    parts.iter().all(|p| matches!(p, Part::Whole(..)))
}

/// A predictor of set accuracy (`--guess`): each of a layer's routed
/// experts is guessed right with probability `accuracy`, and otherwise
/// replaced by one the router did not choose.
struct Guesser {
    accuracy: f64,
    n_expert: u32,
    rng: Rng,
}

impl Guesser {
    /// The guess of a layer whose router chooses `chosen`.
    fn guess(&mut self, chosen: &[u32]) -> Vec<u32> {
        let mut guessed: Vec<u32> = Vec::with_capacity(chosen.len());
        for &e in chosen {
            if self.rng.unit() < self.accuracy || chosen.len() as u32 >= self.n_expert {
                guessed.push(e);
                continue;
            }
            loop {
                let other = self.rng.below(u64::from(self.n_expert)) as u32;
                if !chosen.contains(&other) && !guessed.contains(&other) {
                    guessed.push(other);
                    break;
                }
            }
        }
        guessed
    }

    /// Guess the experts of the layer whose expert nodes are `layer`
    /// (`Weights::prefetch_likely`), the same experts in each of its
    /// tensors, as one router's guess.
    fn announce(&mut self, w: &Weights, layer: &[Vec<Part>]) {
        let chosen: Vec<u32> = layer[0]
            .iter()
            .filter_map(|p| match p {
                Part::Expert(_, e) => Some(*e),
                _ => None,
            })
            .collect();
        let guessed = self.guess(&chosen);
        let parts: Vec<Part> = layer
            .iter()
            .filter_map(|n| match n.first() {
                Some(&Part::Expert(i, _)) => Some(guessed.iter().map(move |&e| Part::Expert(i, e))),
                _ => None,
            })
            .flatten()
            .collect();
        announce_as(w, &parts, Weights::prefetch_likely);
    }
}

/// Announce before node `s` of token `t`, as a ggml runtime's hook would:
/// as a node of tensors read whole starts, the next such node's (the next
/// layer's dense tensors, or the output, or the next token's first
/// layer's), and, with a `guesser`, its guess of this layer's experts;
/// once a layer's router has run, the experts of each of its expert nodes,
/// in the order they compute.
fn announce_before(
    w: &Weights,
    tokens: &[Vec<Vec<Part>>],
    t: usize,
    s: usize,
    guesser: Option<&mut Guesser>,
) {
    let steps = &tokens[t];
    if is_whole(&steps[s]) {
        let later = steps[s + 1..]
            .iter()
            .chain(tokens.get(t + 1).into_iter().flatten());
        if let Some(next) = later.into_iter().find(|n| is_whole(n)) {
            announce(w, next);
        }
        let layer: Vec<Vec<Part>> = steps[s + 1..]
            .iter()
            .take_while(|n| is_experts(n))
            .cloned()
            .collect();
        if let (Some(g), false) = (guesser, layer.is_empty()) {
            g.announce(w, &layer);
        }
    }
    if is_experts(&steps[s]) && !is_experts(&steps[s - 1]) {
        let layer = steps[s..].iter().take_while(|n| is_experts(n));
        announce(w, &layer.flatten().copied().collect::<Vec<_>>());
    }
}

/// Decode every token of `tokens` on `threads` threads, announcing with
/// `announcing`, and guessing with `guesser`.
fn decode(
    w: &Weights,
    tokens: &[Vec<Vec<Part>>],
    threads: usize,
    announcing: bool,
    mut guesser: Option<Guesser>,
) -> Decoded {
    let mut d = Decoded {
        checksum: 0,
        token_ms: Vec::new(),
        token_read: Vec::new(),
        expert_ms: 0.0,
        announce_ms: 0.0,
    };
    let pool = Pool::new(threads);
    std::thread::scope(|sc| {
        for _ in 0..pool.workers {
            sc.spawn(|| pool.worker());
        }
        let ms = |since: Instant| since.elapsed().as_secs_f64() * 1e3;
        for (t, steps) in tokens.iter().enumerate() {
            let start = Instant::now();
            for (s, parts) in steps.iter().enumerate() {
                let announcing_at = Instant::now();
                if announcing {
                    announce_before(w, tokens, t, s, guesser.as_mut());
                }
                let announced_ms = ms(announcing_at);
                let node = Instant::now();
                d.checksum = d.checksum.wrapping_add(pool.compute(w, parts));
                if t > 0 {
                    d.announce_ms += announced_ms;
                    if is_experts(parts) {
                        d.expert_ms += ms(node);
                    }
                }
            }
            d.token_ms.push(ms(start));
            d.token_read.push(read_bytes());
        }
        pool.stop();
    });
    d
}

fn main() {
    let a = parse_args();
    let opts = match a.mode.as_str() {
        // llama.cpp's plain mapping, without its populate.
        "plain" => LoadOptions::default()
            .advice(AdvicePolicy::Uniform(AccessAdvice::Normal))
            .prefetch(Prefetch::None),
        _ => LoadOptions::default(),
    };
    let t0 = Instant::now();
    // SAFETY: the benchmark's file is not changed while it runs.
    let w = unsafe { Weights::load(&a.file, &opts) }.unwrap_or_else(|e| usage(&e.to_string()));
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let m = model_of(&w);
    let route = routing(&m, &a);
    let mut ids = Rng(a.seed ^ 0xdead_beef);
    let tokens: Vec<Vec<Vec<Part>>> = route
        .iter()
        .map(|r| token_parts(&m, &w, r, ids.next()))
        .collect();
    let io0 = read_bytes();
    let Decoded {
        checksum,
        token_ms,
        token_read,
        expert_ms,
        announce_ms,
    } = decode(
        &w,
        &tokens,
        a.threads,
        a.mode == "announce",
        a.guess.map(|accuracy| Guesser {
            accuracy,
            n_expert: m.n_expert,
            rng: Rng(a.seed ^ 0x6765_7373),
        }),
    );
    let read = read_bytes() - io0;
    let touched: u64 = tokens
        .iter()
        .flatten()
        .flatten()
        .map(|&p| size_of(&w, p))
        .sum();
    let n = a.tokens as f64;
    let steady: f64 = token_ms.iter().skip(1).sum::<f64>() / (n - 1.0).max(1.0);
    let must_read = a
        .budget
        .map(|b| missed(&w, &tokens, b.saturating_sub(64 << 20)));
    let per_token = |v: &[u64]| v.iter().sum::<u64>() as f64 / n;
    let or_null = |v: Option<String>| v.unwrap_or_else(|| "null".into());
    let by_token = |v: &[u64]| format!("[{}]", join(v.iter().map(u64::to_string)));
    let json = format!(
        "{{\"mode\": \"{}\", \"guess\": {}, \"routing\": \"{}\", \"synthetic_routing\": true, \"tokens\": {}, \"layers\": {}, \"experts\": {}, \"used\": {}, \"load_ms\": {:.1}, \"first_token_ms\": {:.1}, \"tok_s\": {:.3}, \"expert_ms_per_token\": {:.1}, \"announce_ms_per_token\": {:.1}, \"read_bytes_per_token\": {:.0}, \"touched_bytes_per_token\": {:.0}, \"fixed_missed_per_token\": {}, \"lru_missed_per_token\": {}, \"fixed_token_missed\": {}, \"lru_token_missed\": {}, \"checksum\": \"{checksum:016x}\", \"token_ms\": [{}], \"token_read_bytes\": [{}]}}",
        a.mode, or_null(a.guess.map(|p| p.to_string())), a.routing, a.tokens, m.layers.len(), m.n_expert, m.n_used, load_ms, token_ms[0],
        1e3 / steady, expert_ms / (n - 1.0).max(1.0),
        announce_ms / (n - 1.0).max(1.0), read as f64 / n, touched as f64 / n,
        or_null(must_read.as_ref().map(|m| format!("{:.0}", m.fixed_warm_per_token))),
        or_null(must_read.as_ref().map(|m| format!("{:.0}", per_token(&m.lru)))),
        or_null(must_read.as_ref().map(|m| by_token(&m.fixed))),
        or_null(must_read.as_ref().map(|m| by_token(&m.lru))),
        join(token_ms.iter().map(|ms| format!("{ms:.1}"))),
        join(token_read.iter().scan(io0, |prev, &now| {
            let d = now - *prev;
            *prev = now;
            Some(d.to_string())
        })),
    );
    if a.json {
        println!("{json}");
    } else {
        println!("{}", json.replace(", \"", "\n  \""));
    }
}
