//! A per-thread cache of freed small blocks in front of the system allocator.
//!
//! Why: the static musl build's allocator takes a process-wide lock on every malloc and free and
//! hands freed memory straight back to the kernel, and each API request allocates and frees a few
//! dozen blocks; served from a thread-local free list instead, with no lock and no syscall, the
//! operator runs at glibc's CPU, idle in 1 to 2 MiB less than with jemalloc, mimalloc or glibc's
//! malloc (docs/benchmark.md, "Allocators").
//!
//! Blocks are never split or merged: one of class `c` is always a system allocation of
//! [`class_size`]`(c)` bytes, so any thread can reuse it. Only the long-lived busy threads that
//! ask ([`cache_this_thread`]) cache, at most [`CLASS_BYTES`] a class.
//!
//! The classes are musl's own (its mallocng's size classes), so that the static build's
//! allocator rounds no block up a second time: a block of 16 · n − 4 bytes fills a slot of
//! 16 · n exactly, where the round sizes this cache used before (160, 192, 4096 bytes) took
//! the next slot up (192, 240, 4672: 20 % more). On glibc a block costs what it did.

// The crate's one exception to `deny(unsafe_code)` (src/lib.rs): a global allocator is unsafe by
// definition. Every unsafe block says why it holds.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr;

/// musl's size classes in 16-byte units (`size_classes` in src/malloc/mallocng/malloc.c), up to
/// 64 KiB: a watch buffer; larger blocks are rare. About four classes to each doubling, so a
/// block is at most 26 % larger than asked for (or 15 bytes, below 64).
const UNITS: [u16; 44] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 18, 20, 25, 31, 36, 42, 50, 63, 72, 84, 102, 127, 146,
    170, 204, 255, 292, 340, 409, 511, 584, 682, 818, 1023, 1169, 1364, 1637, 2047, 2340, 2730,
    3276, 4095,
];
const CLASSES: usize = UNITS.len();
/// The bytes of each musl slot that its header takes.
const HEADER: usize = 4;
/// The system allocator's own alignment: every block has it.
const ALIGN: usize = 16;
/// Bytes a thread keeps per class before frees go back to the system. 4 KiB, not 32 with one
/// block of every larger class kept: the 32 workers' caches then held about 1.5 MiB at the peak
/// of 1,000 objects, for no CPU the bench could tell (docs/benchmark.md, "Pods first").
pub const CLASS_BYTES: usize = 4 * 1024;

/// The allocator; `main.rs` installs it with `#[global_allocator]`.
pub struct Cached;

/// A cached block's first word: the next free block of its class.
struct Free {
    next: *mut Free,
}

struct Cache {
    on: Cell<bool>,
    heads: [Cell<*mut Free>; CLASSES],
    lens: [Cell<u32>; CLASSES],
}

thread_local! {
    // const-initialised and without Drop, so reaching it never allocates and never registers
    // a destructor: safe from inside the allocator.
    static CACHE: Cache = const {
        Cache {
            on: Cell::new(false),
            heads: [const { Cell::new(ptr::null_mut()) }; CLASSES],
            lens: [const { Cell::new(0) }; CLASSES],
        }
    };
}

/// Caching for the current thread, until the guard is dropped (at the latest when the thread
/// ends): then the thread's cached blocks go back to the system allocator.
#[must_use = "the cache is released when the guard is dropped"]
pub struct ThreadCache {
    // Not Send: the guard must release the cache of the thread that made it.
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Turns the cache on for the calling thread; keep the guard for the thread's lifetime.
pub fn cache_this_thread() -> ThreadCache {
    let _ = CACHE.try_with(|c| c.on.set(true));
    ThreadCache {
        _not_send: std::marker::PhantomData,
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        let _ = CACHE.try_with(|c| {
            c.on.set(false);
            for class in 0..CLASSES {
                let mut head = c.heads[class].replace(ptr::null_mut());
                c.lens[class].set(0);
                while !head.is_null() {
                    // SAFETY: a cached block: a live system allocation of this class.
                    unsafe {
                        let next = (*head).next;
                        System.dealloc(head as *mut u8, class_layout(class));
                        head = next;
                    }
                }
            }
        });
    }
}

/// The class serving `layout`, or None for what goes straight to the system: musl's
/// `size_to_class`, so that the class is the slot musl would have given the request.
#[inline]
fn class_of(layout: &Layout) -> Option<usize> {
    // A block is aligned to 16 when it holds 16 bytes or more, to 8 below (see `class_layout`).
    let size = layout.size().max(layout.align()).max(1);
    if layout.align() > ALIGN || size > class_size(CLASSES - 1) {
        return None;
    }
    let n = (size + HEADER - 1) >> 4;
    if n < 10 {
        return Some(n);
    }
    let n = n + 1;
    let mut i = (28 - (n as u32).leading_zeros() as usize) * 4 + 8;
    if n > UNITS[i + 1] as usize {
        i += 2;
    }
    if n > UNITS[i] as usize {
        i += 1;
    }
    Some(i)
}

/// The size of every block of `class`: its musl slot, less the slot's header.
#[inline]
const fn class_size(class: usize) -> usize {
    UNITS[class] as usize * 16 - HEADER
}

#[inline]
fn class_layout(class: usize) -> Layout {
    // Asked of the system with an alignment no larger than the size, so that it is a plain
    // malloc (Rust's System takes posix_memalign otherwise); malloc aligns to 16 anyway.
    let size = class_size(class);
    // SAFETY: a size under 64 KiB with a power-of-two alignment: always a valid layout.
    unsafe { Layout::from_size_align_unchecked(size, if size < ALIGN { 8 } else { ALIGN }) }
}

/// The most blocks a thread keeps of `class`.
#[inline]
fn class_limit(class: usize) -> u32 {
    (CLASS_BYTES / class_size(class)) as u32
}

#[inline]
fn pop(class: usize) -> *mut u8 {
    CACHE
        .try_with(|c| {
            let head = c.heads[class].get();
            if !head.is_null() {
                // SAFETY: every block on the list is a live, unused system allocation of this
                // class whose first word we wrote in push().
                c.heads[class].set(unsafe { (*head).next });
                c.lens[class].set(c.lens[class].get() - 1);
            }
            head as *mut u8
        })
        .unwrap_or(ptr::null_mut())
}

/// Keeps the block if the class has room; false means the caller must free it.
#[inline]
fn push(class: usize, block: *mut u8) -> bool {
    CACHE
        .try_with(|c| {
            let len = c.lens[class].get();
            if !c.on.get() || len >= class_limit(class) {
                return false;
            }
            let node = block as *mut Free;
            // SAFETY: the block is at least 12 bytes, 8-aligned and no longer in use.
            unsafe {
                node.write(Free {
                    next: c.heads[class].get(),
                })
            };
            c.heads[class].set(node);
            c.lens[class].set(len + 1);
            true
        })
        .unwrap_or(false)
}

unsafe impl GlobalAlloc for Cached {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match class_of(&layout) {
            Some(class) => match pop(class) {
                p if p.is_null() => System.alloc(class_layout(class)),
                p => p,
            },
            None => System.alloc(layout),
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match class_of(&layout) {
            Some(class) => match pop(class) {
                p if p.is_null() => System.alloc_zeroed(class_layout(class)),
                p => {
                    ptr::write_bytes(p, 0, layout.size());
                    p
                }
            },
            None => System.alloc_zeroed(layout),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        match class_of(&layout) {
            Some(class) => {
                if !push(class, p) {
                    System.dealloc(p, class_layout(class))
                }
            }
            None => System.dealloc(p, layout),
        }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        match (class_of(&layout), class_of(&new_layout)) {
            // A Vec growing within its class: the block already has the room.
            (Some(old), Some(new)) if old == new => p,
            // Both outside the classes: let the system move or extend it (mremap for big ones).
            (None, None) => System.realloc(p, layout, new_size),
            _ => {
                let q = self.alloc(new_layout);
                if !q.is_null() {
                    ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                    self.dealloc(p, layout);
                }
                q
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize) -> Layout {
        Layout::from_size_align(size, 8).unwrap()
    }

    /// The class `size` bytes (alignment ≤ 16) fall in.
    fn class_for_size(size: usize) -> Option<usize> {
        Layout::from_size_align(size, 1)
            .ok()
            .as_ref()
            .and_then(class_of)
    }

    /// How many blocks of `class` this thread holds.
    fn cached_blocks(class: usize) -> u32 {
        CACHE.try_with(|c| c.lens[class].get()).unwrap_or(0)
    }

    #[test]
    fn classes_are_musls_slots_from_12_bytes_to_64_kib_each_at_most_26_percent_above_what_it_serves(
    ) {
        assert_eq!(class_for_size(1), Some(0));
        assert_eq!(class_size(0), 12);
        assert_eq!(class_for_size(13), Some(1));
        // The sizes measured on the static build (docs/benchmark.md): what used to be rounded
        // up to 160, 192 and 4096 bytes now fills a slot of musl's exactly.
        assert_eq!(class_size(class_for_size(160).unwrap()), 188);
        assert_eq!(class_size(class_for_size(168).unwrap()), 188);
        assert_eq!(class_size(class_for_size(192).unwrap()), 236);
        assert_eq!(class_size(class_for_size(4076).unwrap()), 4076);
        assert_eq!(class_size(class_for_size(4077).unwrap()), 4668);
        assert_eq!(class_size(CLASSES - 1), 65516);
        assert_eq!(class_for_size(65516), Some(CLASSES - 1));
        assert_eq!(class_for_size(65517), None);
        // Every size gets the smallest class that holds it, and wastes at most 26 % (or 15
        // bytes below 64).
        let mut prev = 0;
        for size in 1..=65516 {
            let c = class_for_size(size).unwrap();
            assert!(c == prev || c == prev + 1, "{size}: class {c} after {prev}");
            assert!(class_size(c) >= size, "{size} in class {c}");
            assert!(
                c == 0 || class_size(c - 1) < size,
                "{size} fits class {}",
                c - 1
            );
            assert_eq!((class_size(c) + HEADER) % 16, 0);
            assert!(
                class_size(c) - size <= (size * 26 / 100).max(15),
                "{size} in {}",
                class_size(c)
            );
            prev = c;
        }
        // A 16-aligned request gets a block of 16 bytes or more, which the system aligns so.
        assert_eq!(class_of(&Layout::from_size_align(4, 16).unwrap()), Some(1));
        assert_eq!(class_layout(0).align(), 8);
        assert_eq!(class_layout(1).align(), 16);
        // Over-aligned requests bypass the cache: its blocks are only 16-aligned.
        assert_eq!(class_of(&Layout::from_size_align(64, 64).unwrap()), None);
    }

    #[test]
    fn a_freed_block_is_reused_by_the_next_allocation_of_its_class() {
        // Runs on its own thread so no other test's allocations share the cache.
        std::thread::spawn(|| unsafe {
            let _cache = cache_this_thread();
            let a = Cached.alloc(layout(100));
            a.write_bytes(0xAB, 100);
            let class = class_for_size(100).unwrap();
            let before = cached_blocks(class);
            Cached.dealloc(a, layout(100));
            assert_eq!(cached_blocks(class), before + 1);
            // Any size of the same class (93..=108 bytes) gets the same block back.
            let b = Cached.alloc(layout(108));
            assert_eq!(b, a);
            assert_eq!(cached_blocks(class), before);
            // alloc_zeroed must clear a reused block.
            Cached.dealloc(b, layout(108));
            let z = Cached.alloc_zeroed(layout(105));
            assert_eq!(z, a);
            assert!(std::slice::from_raw_parts(z, 105).iter().all(|&x| x == 0));
            Cached.dealloc(z, layout(105));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_that_did_not_ask_caches_nothing() {
        std::thread::spawn(|| unsafe {
            let class = class_for_size(300).unwrap();
            let p = Cached.alloc(layout(300));
            Cached.dealloc(p, layout(300));
            assert_eq!(cached_blocks(class), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn dropping_the_guard_returns_every_cached_block() {
        std::thread::spawn(|| unsafe {
            let class = class_for_size(200).unwrap();
            let cache = cache_this_thread();
            let blocks: Vec<_> = (0..5).map(|_| Cached.alloc(layout(200))).collect();
            for &b in &blocks {
                Cached.dealloc(b, layout(200));
            }
            assert_eq!(cached_blocks(class), 5);
            drop(cache);
            assert_eq!(cached_blocks(class), 0);
            // Off again: a free goes to the system.
            let p = Cached.alloc(layout(200));
            Cached.dealloc(p, layout(200));
            assert_eq!(cached_blocks(class), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_cache_holds_at_most_its_limit_and_frees_the_rest() {
        std::thread::spawn(|| unsafe {
            let _cache = cache_this_thread();
            let class = class_for_size(1024).unwrap();
            let limit = class_limit(class) as usize;
            assert_eq!(limit, CLASS_BYTES / class_size(class));
            let blocks: Vec<_> = (0..limit + 10)
                .map(|_| Cached.alloc(layout(1024)))
                .collect();
            for &b in &blocks {
                Cached.dealloc(b, layout(1024));
            }
            assert_eq!(cached_blocks(class) as usize, limit);
            // A class larger than CLASS_BYTES is never kept: a thread's cache stays small.
            assert_eq!(class_limit(class_for_size(4076).unwrap()), 1);
            assert_eq!(class_limit(class_for_size(4077).unwrap()), 0);
            let big = Cached.alloc(layout(4077));
            Cached.dealloc(big, layout(4077));
            assert_eq!(cached_blocks(class_for_size(4077).unwrap()), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn realloc_keeps_contents_across_classes_and_in_place_within_one() {
        std::thread::spawn(|| unsafe {
            let _cache = cache_this_thread();
            let p = Cached.alloc(layout(40));
            for i in 0..40 {
                *p.add(i) = i as u8;
            }
            // 40 and 44 bytes share the 44-byte class: no move.
            let q = Cached.realloc(p, layout(40), 44);
            assert_eq!(q, p);
            // Up a class, then past the largest class, then back down: contents survive.
            let r = Cached.realloc(q, layout(44), 3000);
            let s = Cached.realloc(r, layout(3000), 200_000);
            let t = Cached.realloc(s, layout(200_000), 300_000);
            let u = Cached.realloc(t, layout(300_000), 40);
            assert!((0..40).all(|i| *u.add(i) == i as u8));
            Cached.dealloc(u, layout(40));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn blocks_churned_across_caching_threads_keep_their_contents() {
        // Four caching threads allocate blocks of every class, fill them with a pattern of
        // their own, and pass them around a ring; each checks and frees what it receives. A
        // free-list bug (a block handed out twice, a next pointer in live data) breaks a
        // pattern or crashes.
        use std::sync::mpsc;
        const THREADS: usize = 4;
        const ROUNDS: usize = 2000;
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS)
            .map(|_| mpsc::channel::<(usize, usize, u8)>())
            .unzip();
        let mut handles = Vec::new();
        for (i, rx) in rxs.into_iter().enumerate() {
            let tx = txs[(i + 1) % THREADS].clone();
            handles.push(std::thread::spawn(move || unsafe {
                let _cache = cache_this_thread();
                let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ i as u64;
                for round in 0..ROUNDS {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let size = 1 + (seed as usize % (70 * 1024));
                    let fill = (round % 251) as u8;
                    let p = Cached.alloc(layout(size));
                    assert!(!p.is_null());
                    p.write_bytes(fill, size);
                    tx.send((p as usize, size, fill)).unwrap();
                    while let Ok((q, qsize, qfill)) = rx.try_recv() {
                        let q = q as *mut u8;
                        assert!(std::slice::from_raw_parts(q, qsize)
                            .iter()
                            .all(|&b| b == qfill));
                        Cached.dealloc(q, layout(qsize));
                    }
                }
                drop(tx);
                rx
            }));
        }
        drop(txs);
        // Join every thread before draining: a receiver dropped early would fail the send of
        // a thread still running.
        let rxs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for rx in rxs {
            for (q, qsize, qfill) in rx.try_iter() {
                let q = q as *mut u8;
                unsafe {
                    assert!(std::slice::from_raw_parts(q, qsize)
                        .iter()
                        .all(|&b| b == qfill));
                    Cached.dealloc(q, layout(qsize));
                }
            }
        }
    }

    #[test]
    fn blocks_freed_on_another_thread_are_reused_there() {
        let size = 5000;
        let addr = std::thread::spawn(move || unsafe { Cached.alloc(layout(size)) as usize })
            .join()
            .unwrap();
        std::thread::spawn(move || unsafe {
            let _cache = cache_this_thread();
            let p = addr as *mut u8;
            Cached.dealloc(p, layout(size));
            assert_eq!(Cached.alloc(layout(size)), p);
            Cached.dealloc(p, layout(size));
        })
        .join()
        .unwrap();
    }
}
