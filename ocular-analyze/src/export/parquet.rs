//! Parquet export (feature `parquet`): `events.parquet`, `calls.parquet` and `code.parquet` in a directory,
//! the tables of [`crate::table`], written batch by batch with polars (one row group per batch, so memory
//! does not grow with the trace). Text columns are polars `Enum`s built from the tables' dictionary codes,
//! so they are written as Parquet dictionary pages without hashing a string per row; polars reads them back
//! as `Enum`, pandas (pyarrow) as `category`.

use crate::table::{self, Batch, Column, Sink, Summary, Table};
use anyhow::Context;
use ocular_format::ReadOptions;
use polars::prelude::{
    BatchedWriter, BinaryChunked, CategoricalPhysical, ChunkedArray, DataFrame, DataType, FrozenCategories, Int64Type,
    IntoColumn, IntoSeries, NamedFrom, ParquetCompression, ParquetWriter, PlSmallStr, Series, UInt16Chunked,
    UInt32Type, UInt64Type, UInt8Chunked,
};
use rustc_hash::FxHashMap as HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// A text column as a polars `Enum` whose categories are the dictionary, in order, so codes carry over.
fn enum_series(name: PlSmallStr, codes: &[Option<u32>], dict: &[String]) -> anyhow::Result<Series> {
    let fc = FrozenCategories::new(dict.iter().map(String::as_str))?;
    let dtype = DataType::from_frozen_categories(fc.clone());
    let cats = match fc.physical() {
        CategoricalPhysical::U8 => {
            codes.iter().map(|c| c.map(|c| c as u8)).collect::<UInt8Chunked>().with_name(name).into_series()
        }
        CategoricalPhysical::U16 => {
            codes.iter().map(|c| c.map(|c| c as u16)).collect::<UInt16Chunked>().with_name(name).into_series()
        }
        CategoricalPhysical::U32 => Series::new(name, codes),
    };
    Ok(Series::from_cats_and_dtype(&cats, &dtype, false)?)
}

/// Converts a batch to a polars `DataFrame`.
pub fn dataframe(batch: Batch) -> anyhow::Result<DataFrame> {
    let mut cols = Vec::with_capacity(batch.columns.len());
    for (name, col) in batch.columns {
        let name = PlSmallStr::from_static(name);
        let s: Series = match col {
            Column::U64(v) => ChunkedArray::<UInt64Type>::from_vec(name, v).into_series(),
            Column::OptU64(v) => Series::new(name, v),
            Column::I64(v) => ChunkedArray::<Int64Type>::from_vec(name, v).into_series(),
            Column::U32(v) => ChunkedArray::<UInt32Type>::from_vec(name, v).into_series(),
            Column::OptI32(v) => Series::new(name, v),
            Column::Dict(codes, dict) => enum_series(name, &codes, &dict)?,
            Column::Binary(v) => v.into_iter().collect::<BinaryChunked>().with_name(name).into_series(),
        };
        cols.push(s.into_column());
    }
    Ok(DataFrame::new(batch.rows, cols)?)
}

/// Writes one Parquet file per table into a directory.
struct ParquetWriters {
    dir: PathBuf,
    writers: HashMap<Table, BatchedWriter<BufWriter<File>>>,
}

impl ParquetWriters {
    fn batch(&mut self, table: Table, batch: Batch) -> anyhow::Result<()> {
        let df = dataframe(batch)?;
        let w = match self.writers.entry(table) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let path = self.dir.join(format!("{}.parquet", table.name()));
                let f = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
                // zstd at its default level: LZ4 wrote 10% faster but files 2.8x larger (BENCHMARKS.md).
                let w = ParquetWriter::new(BufWriter::with_capacity(1 << 20, f))
                    .with_compression(ParquetCompression::Zstd(None))
                    .batched(df.schema())?;
                v.insert(w)
            }
        };
        w.write_batch(&df)?;
        Ok(())
    }
}

/// Hands batches to the thread that writes them: reading and building the tables overlaps with encoding
/// and compressing them (two batches in flight at most, so memory stays bounded).
struct Pipe(std::sync::mpsc::SyncSender<(Table, Batch)>);

impl Sink for Pipe {
    fn batch(&mut self, table: Table, batch: Batch) -> anyhow::Result<()> {
        // A closed channel means the writer failed; its error is reported when it is joined.
        self.0.send((table, batch)).map_err(|_| anyhow::anyhow!("the Parquet writer stopped"))
    }
}

/// Exports `path` into `dir` (created if missing) as events.parquet, calls.parquet and code.parquet.
pub fn export(path: &Path, opts: ReadOptions, dir: &Path) -> anyhow::Result<Summary> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create directory {}", dir.display()))?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<(Table, Batch)>(1);
    let mut w = ParquetWriters { dir: dir.to_owned(), writers: HashMap::default() };
    let writer = std::thread::Builder::new().name("parquet-writer".into()).spawn(move || -> anyhow::Result<()> {
        for (table, batch) in rx {
            w.batch(table, batch)?;
        }
        for (t, w) in w.writers {
            w.finish().with_context(|| format!("cannot finish {}.parquet", t.name()))?;
        }
        Ok(())
    })?;
    let mut pipe = Pipe(tx);
    let built =
        table::build(path, opts, &[Table::Code, Table::Calls, Table::Events], table::DEFAULT_BATCH_ROWS, &mut pipe);
    drop(pipe);
    let written = writer.join().map_err(|_| anyhow::anyhow!("the Parquet writer panicked"))?;
    // The writer's error explains a build that stopped because the writer did.
    written?;
    built
}
