//! Giving the memory a compile or an eviction freed back to the system.

use wasmtime::component::Component;

/// The size of a compiled component's image in memory.
pub(super) fn image_bytes(component: &Component) -> usize {
    let range = component.image_range();
    (range.end as usize).saturating_sub(range.start as usize)
}

/// [`release_free_memory`] when `freed` bytes are worth it: trimming walks the allocator's
/// heaps (milliseconds), so small rules, swapped often, skip it.
pub(crate) fn release_free_memory_after(freed: usize) {
    if freed >= TRIM_AFTER_BYTES {
        release_free_memory();
    }
}

/// Below this, memory freed by a rule's compile, load or eviction is left to the allocator.
const TRIM_AFTER_BYTES: usize = 4 << 20;

/// Gives memory freed by the allocator back to the system. Compiling a large rule (a 25 MB
/// component) allocates hundreds of MB of temporary buffers, and glibc keeps freed heap
/// memory (its mmap threshold grows after large frees), so without this the resident size
/// stays at the compile's peak and grows with each swap of a new rule version.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it takes the allocator's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}
