//! Parquet export (feature `parquet`): `events.parquet`, `calls.parquet` and `code.parquet` in a directory,
//! the tables of [`crate::table`], written batch by batch with polars (one row group per batch, so memory
//! does not grow with the trace). Text columns are polars `Enum`s built from the tables' dictionary codes,
//! so they are written as Parquet dictionary pages without hashing a string per row; polars reads them back
//! as `Enum`, pandas (pyarrow) as `category`. Integer columns are written `DELTA_BINARY_PACKED`:
//! timestamps rise by small steps, and ids, offsets and lines change little from row to row, so they take
//! a byte or two per row before compression. (polars' own writer would try a dictionary for each, then
//! write timestamps plain and leave zstd to squeeze 8 bytes a row: 3x the file, and its slowest part.)

use crate::table::{self, Batch, Column, Sink, Summary, Table};
use anyhow::Context;
use ocular_format::ReadOptions;
use polars::prelude::{
    ArrowDataType, BinaryChunked, Categorical16Chunked, Categorical32Chunked, Categorical8Chunked, CategoricalPhysical,
    ChunkedArray, CompatLevel, DataFrame, DataType, FrozenCategories, Int32Type, Int64Type, IntoColumn, IntoSeries,
    PlSmallStr, PolarsError, PolarsNumericType, SchemaExt, Series, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use polars_parquet::read::ParquetError;
use polars_parquet::write::{
    array_to_columns, get_dtype_encoding, to_parquet_schema, CompressionOptions, Compressor, DynIter,
    DynStreamingIterator, Encoding, FallibleStreamingIterator, FileWriter, ParquetType, StatisticsOptions, Version,
    WriteOptions, ZstdLevel,
};
use rustc_hash::FxHashMap as HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// A text column as a polars `Enum` whose categories are the dictionary, in order, so codes carry over.
fn enum_series(name: PlSmallStr, codes: &[Option<u32>], dict: &[String]) -> anyhow::Result<Series> {
    let fc = FrozenCategories::new(dict.iter().map(String::as_str))?;
    let dtype = DataType::from_frozen_categories(fc.clone());
    let n = dict.len();
    Ok(match fc.physical() {
        CategoricalPhysical::U8 => {
            let ca = checked_codes::<UInt8Type>(name, codes, n, |c| c as u8)?;
            // SAFETY: every code was checked to be an index into the dictionary, whose strings are the
            // categories, in order; the physical type is the one the categories asked for.
            unsafe { Categorical8Chunked::from_cats_and_dtype_unchecked(ca, dtype) }.into_series()
        }
        CategoricalPhysical::U16 => {
            let ca = checked_codes::<UInt16Type>(name, codes, n, |c| c as u16)?;
            // SAFETY: as above.
            unsafe { Categorical16Chunked::from_cats_and_dtype_unchecked(ca, dtype) }.into_series()
        }
        CategoricalPhysical::U32 => {
            let ca = checked_codes::<UInt32Type>(name, codes, n, |c| c)?;
            // SAFETY: as above.
            unsafe { Categorical32Chunked::from_cats_and_dtype_unchecked(ca, dtype) }.into_series()
        }
    })
}

/// Dictionary codes, each checked to be below `n`, as a polars array of their physical type: one pass
/// into a plain vector while there is no null (most columns of most batches), else with their validity.
fn checked_codes<T: PolarsNumericType>(
    name: PlSmallStr,
    codes: &[Option<u32>],
    n: usize,
    to: impl Fn(u32) -> T::Native,
) -> anyhow::Result<ChunkedArray<T>> {
    let bad = |c: u32| anyhow::anyhow!("column {name}: code {c} outside its dictionary of {n}");
    let mut out = Vec::with_capacity(codes.len());
    for c in codes {
        match *c {
            Some(c) if (c as usize) < n => out.push(to(c)),
            Some(c) => return Err(bad(c)),
            None => {
                if let Some(&c) = codes.iter().flatten().find(|&&c| c as usize >= n) {
                    return Err(bad(c));
                }
                return Ok(physical::<T, u32>(name, codes, to));
            }
        }
    }
    Ok(ChunkedArray::<T>::from_vec(name, out))
}

/// Optional values (converted by `to`) as a polars array: taken as a plain vector when there is no null
/// (most columns of most batches), else collected with their validity.
fn physical<T: PolarsNumericType, V: Copy + Default>(
    name: PlSmallStr,
    values: &[Option<V>],
    to: impl Fn(V) -> T::Native,
) -> ChunkedArray<T> {
    if values.iter().all(Option::is_some) {
        ChunkedArray::<T>::from_vec(name, values.iter().map(|v| to(v.unwrap_or_default())).collect())
    } else {
        values.iter().map(|v| v.map(&to)).collect::<ChunkedArray<T>>().with_name(name)
    }
}

/// Converts a batch to a polars `DataFrame`.
pub fn dataframe(batch: Batch) -> anyhow::Result<DataFrame> {
    let mut cols = Vec::with_capacity(batch.columns.len());
    for (name, col) in batch.columns {
        let name = PlSmallStr::from_static(name);
        let s: Series = match col {
            Column::U64(v) => ChunkedArray::<UInt64Type>::from_vec(name, v).into_series(),
            Column::OptU64(v) => physical::<UInt64Type, u64>(name, &v, |x| x).into_series(),
            Column::I64(v) => ChunkedArray::<Int64Type>::from_vec(name, v).into_series(),
            Column::U32(v) => ChunkedArray::<UInt32Type>::from_vec(name, v).into_series(),
            Column::OptI32(v) => physical::<Int32Type, i32>(name, &v, |x| x).into_series(),
            Column::Dict(codes, dict) => enum_series(name, &codes, &dict)?,
            Column::Binary(v) => v.into_iter().collect::<BinaryChunked>().with_name(name).into_series(),
        };
        cols.push(s.into_column());
    }
    Ok(DataFrame::new(batch.rows, cols)?)
}

/// How a column is encoded: integers `DELTA_BINARY_PACKED` (timestamps rise by small steps, and ids,
/// offsets and lines move by small steps between neighbouring rows), text (polars `Enum`s) as dictionary
/// pages, anything else as polars would.
fn encoding(dtype: &ArrowDataType) -> Vec<Encoding> {
    use ArrowDataType as D;
    match dtype {
        D::Int8 | D::Int16 | D::Int32 | D::Int64 | D::UInt8 | D::UInt16 | D::UInt32 | D::UInt64 => {
            vec![Encoding::DeltaBinaryPacked]
        }
        _ => get_dtype_encoding(dtype),
    }
}

/// One Parquet file, written with polars' Parquet layer (what polars' `BatchedWriter` does, but with the
/// encoding chosen per column).
struct TableWriter {
    file: FileWriter<BufWriter<File>>,
    fields: Vec<ParquetType>,
    encodings: Vec<Vec<Encoding>>,
    options: WriteOptions,
}

impl TableWriter {
    fn create(path: &Path, df: &DataFrame) -> anyhow::Result<Self> {
        let f = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        // The Arrow schema as polars makes it (with its Enum metadata, so polars reads Enums back).
        let schema = df.schema().to_arrow(CompatLevel::newest());
        let encodings = schema.iter_values().map(|f| encoding(&f.dtype)).collect();
        let fields = to_parquet_schema(&schema)?.fields().to_vec();
        // zstd level 1: less of the writer thread's time than level 3 (polars' default), for files the same
        // size within 0.1% on the bench trace; LZ4 made them 2.8x larger.
        let options = WriteOptions {
            statistics: StatisticsOptions::default(),
            compression: CompressionOptions::Zstd(Some(ZstdLevel::try_new(1)?)),
            version: Version::V1,
            data_page_size: None,
        };
        let file = FileWriter::try_new(BufWriter::with_capacity(1 << 20, f), schema, options)?;
        Ok(TableWriter { file, fields, encodings, options })
    }

    /// Writes a DataFrame as one row group per chunk.
    fn write(&mut self, df: &DataFrame) -> anyhow::Result<()> {
        for batch in df.iter_chunks(CompatLevel::newest(), false) {
            // An empty table is a file with its schema and no row group (as polars writes it): a row group
            // of no rows would have column chunks without data pages.
            if batch.is_empty() {
                continue;
            }
            let rows = batch.len() as u64;
            let mut columns = Vec::with_capacity(self.fields.len());
            for ((array, field), encoding) in batch.columns().iter().zip(&self.fields).zip(&self.encodings) {
                for pages in array_to_columns(array, field.clone(), self.options, encoding)? {
                    let pages = pages.map(|p| p.map_err(|e| ParquetError::FeatureNotSupported(e.to_string())));
                    let compressed = Compressor::new_from_vec(pages, self.options.compression, Vec::new());
                    columns.push(Ok(DynStreamingIterator::new(compressed.map_err(PolarsError::from))));
                }
            }
            self.file.write(rows, DynIter::new(columns.into_iter()))?;
        }
        Ok(())
    }
}

/// Writes one Parquet file per table into a directory.
struct ParquetWriters {
    dir: PathBuf,
    writers: HashMap<Table, TableWriter>,
}

impl ParquetWriters {
    fn batch(&mut self, table: Table, df: DataFrame) -> anyhow::Result<()> {
        let w = match self.writers.entry(table) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(TableWriter::create(&self.dir.join(format!("{}.parquet", table.name())), &df)?)
            }
        };
        w.write(&df)
    }
}

/// Hands batches, as DataFrames, to the thread that writes them: reading the trace and building the
/// tables and DataFrames overlaps with encoding and compressing them (the writer thread was the busier of
/// the two); two batches in flight at most, so memory stays bounded.
struct Pipe(std::sync::mpsc::SyncSender<(Table, DataFrame)>);

impl Sink for Pipe {
    fn batch(&mut self, table: Table, batch: Batch) -> anyhow::Result<()> {
        let df = dataframe(batch)?;
        // A closed channel means the writer failed; its error is reported when it is joined.
        self.0.send((table, df)).map_err(|_| anyhow::anyhow!("the Parquet writer stopped"))
    }
}

/// Exports `path` into `dir` (created if missing) as events.parquet, calls.parquet and code.parquet.
pub fn export(path: &Path, opts: ReadOptions, dir: &Path) -> anyhow::Result<Summary> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create directory {}", dir.display()))?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<(Table, DataFrame)>(1);
    let mut w = ParquetWriters { dir: dir.to_owned(), writers: HashMap::default() };
    let writer = std::thread::Builder::new().name("parquet-writer".into()).spawn(move || -> anyhow::Result<()> {
        for (table, df) in rx {
            w.batch(table, df)?;
        }
        for (t, mut w) in w.writers {
            w.file.end(None).with_context(|| format!("cannot finish {}.parquet", t.name()))?;
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
