//! Model images: the bytes of a GGUF file as the engine sees them, wherever they live — a
//! memory-mapped file, an owned buffer, or a model region filled by a loader. The forward pass
//! reads weights in place from [`ModelImage::bytes`] and tells the image which layer it is
//! entering, so a lazy loader can prefetch ahead of it.

use std::fs::File;
use std::path::Path;

/// The bytes of a model file, byte `i` of the image being byte `i` of the file.
pub trait ModelImage: Send + Sync {
    /// The whole image. Reading it may block while a lazy loader fills the page.
    fn bytes(&self) -> &[u8];

    /// Hint: the forward pass is about to read layer `layer`'s weights.
    fn enter_layer(&self, _layer: usize) {}

    /// A failure of the loader behind the image (reads after a failure may see zeros).
    fn load_error(&self) -> Option<String> {
        None
    }
}

/// A read-only memory map of a model file (the kernel pages it in on demand).
pub struct MappedFile {
    map: memmap2::Mmap,
}

impl MappedFile {
    pub fn open(path: &Path) -> std::io::Result<MappedFile> {
        let file = File::open(path)?;
        // SAFETY: the map is read-only and private to this process; airs never writes model
        // files, and a file truncated by another process while mapped is outside the contract
        // of this image (the lazy loader handles that case and reports it).
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(MappedFile { map })
    }
}

impl ModelImage for MappedFile {
    fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// An owned copy of a model file (tests, embedded models).
pub struct OwnedImage(pub Vec<u8>);

impl ModelImage for OwnedImage {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A model image embedded in the binary.
pub struct StaticImage(pub &'static [u8]);

impl ModelImage for StaticImage {
    fn bytes(&self) -> &[u8] {
        self.0
    }
}
