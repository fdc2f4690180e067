//! Opening the model a command names: a GGUF path, or the embedded default model
//! (stories260K, MIT-licensed, see models/LICENSE-stories260K.txt) when none is given.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use airs_engine::{MappedFile, ModelImage, StaticImage};
use anyhow::Context;

/// The embedded default model.
pub static DEFAULT_MODEL: &[u8] = include_bytes!("../../../models/stories260K.gguf");
pub const DEFAULT_MODEL_NAME: &str = "stories260K.gguf (embedded)";

/// A model image and the name to report it by.
pub struct ModelFile {
    pub image: Arc<dyn ModelImage>,
    pub name: String,
    pub path: Option<PathBuf>,
}

impl ModelFile {
    /// Map `path`, or use the embedded default when `path` is `None`.
    pub fn open(path: Option<&Path>) -> anyhow::Result<ModelFile> {
        match path {
            None => Ok(ModelFile {
                image: Arc::new(StaticImage(DEFAULT_MODEL)),
                name: DEFAULT_MODEL_NAME.into(),
                path: None,
            }),
            Some(p) => {
                let map =
                    MappedFile::open(p).with_context(|| format!("opening {}", p.display()))?;
                Ok(ModelFile {
                    image: Arc::new(map),
                    name: p.display().to_string(),
                    path: Some(p.to_path_buf()),
                })
            }
        }
    }

    pub fn parse(&self) -> anyhow::Result<airs_gguf::Gguf<'_>> {
        airs_gguf::Gguf::parse(self.image.bytes()).with_context(|| format!("reading {}", self.name))
    }
}
