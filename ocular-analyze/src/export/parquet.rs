//! Parquet export (feature `parquet`): `events.parquet`, `calls.parquet`, `code.parquet`, `lost.parquet` and
//! `counter_samples.parquet` in a directory, the tables of [`crate::table`], written batch by batch with polars (one row group per
//! batch, so memory does not grow with the trace). Text columns are polars `Enum`s built from the tables' dictionary codes,
//! so they are written as Parquet dictionary pages without hashing a string per row; polars reads them back
//! as `Enum`, pandas (pyarrow) as `category`. Integer columns are written `DELTA_BINARY_PACKED`:
//! timestamps rise by small steps, and ids, offsets and lines change little from row to row, so they take
//! a byte or two per row before compression. (polars' own writer would try a dictionary for each, then
//! write timestamps plain and leave zstd to squeeze 8 bytes a row: 3x the file, and its slowest part.)

use crate::table::{self, Batch, Column, Sink, Summary, Table, NULL_CODE};
use anyhow::Context;
use ocular_format::ReadOptions;
use polars::prelude::{
    ArrayRef, ArrowDataType, ArrowSchema, BinaryChunked, BooleanChunked, Categorical16Chunked, Categorical32Chunked,
    Categorical8Chunked, CategoricalPhysical, ChunkedArray, CompatLevel, DataFrame, DataType, FrozenCategories,
    Int32Type, Int64Type, IntoColumn, IntoSeries, PlSmallStr, PolarsNumericType, PolarsResult, SchemaExt, Series,
    UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use polars_arrow::bitmap::Bitmap;
use polars_parquet::read::ParquetError;
use polars_parquet::write::{
    array_to_columns, fallible_streaming_iterator, get_dtype_encoding, to_parquet_schema, CompressedPage,
    CompressionOptions, Compressor, DynIter, DynStreamingIterator, Encoding, FileWriter, ParquetType,
    StatisticsOptions, Version, WriteOptions, ZstdLevel,
};
use rustc_hash::FxHashMap as HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// Polars `Enum` types of the dictionaries seen, by dictionary: every batch of a column shares its
/// dictionary (one `Arc`), whose categories are then built once, not once per batch.
#[derive(Default)]
struct Enums(Vec<(Arc<Vec<String>>, Arc<FrozenCategories>, DataType)>);

impl Enums {
    fn get(&mut self, dict: &Arc<Vec<String>>) -> anyhow::Result<(Arc<FrozenCategories>, DataType)> {
        if let Some((_, fc, dtype)) = self.0.iter().find(|(d, _, _)| Arc::ptr_eq(d, dict)) {
            return Ok((fc.clone(), dtype.clone()));
        }
        let fc = FrozenCategories::new(dict.iter().map(String::as_str))?;
        let dtype = DataType::from_frozen_categories(fc.clone());
        self.0.push((dict.clone(), fc.clone(), dtype.clone()));
        Ok((fc, dtype))
    }
}

/// A text column as a polars `Enum` whose categories are the dictionary, in order, so codes carry over.
fn enum_series(name: PlSmallStr, codes: &[u32], dict: &Arc<Vec<String>>, enums: &mut Enums) -> anyhow::Result<Series> {
    let (fc, dtype) = enums.get(dict)?;
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

/// Dictionary codes, each checked to be below `n` or [`NULL_CODE`], as a polars array of their physical
/// type: a check, then one conversion into a plain vector (with a validity only if there is a null).
fn checked_codes<T: PolarsNumericType>(
    name: PlSmallStr,
    codes: &[u32],
    n: usize,
    to: impl Fn(u32) -> T::Native,
) -> anyhow::Result<ChunkedArray<T>> {
    // Codes plus one (a null wraps to 0): their minimum says whether there is a null, their maximum is
    // one more than the largest code. Plain min/max reductions, which vectorize.
    let (min, max) = codes.iter().fold((u32::MAX, 0u32), |(lo, hi), &c| {
        let c = c.wrapping_add(1);
        (lo.min(c), hi.max(c))
    });
    let nulls = min == 0;
    if max as usize > n {
        anyhow::bail!("column {name}: code {} outside its dictionary of {n}", max - 1);
    }
    Ok(if nulls {
        // Values and validity apart: collecting options pushed the validity a bit at a time.
        let values = codes.iter().map(|&c| to(if c == NULL_CODE { 0 } else { c })).collect();
        let valid = Bitmap::from_trusted_len_iter(codes.iter().map(|&c| c != NULL_CODE));
        ChunkedArray::<T>::from_vec_validity(name, values, Some(valid))
    } else {
        ChunkedArray::<T>::from_vec(name, codes.iter().map(|&c| to(c)).collect())
    })
}

/// Optional values (converted by `to`) as a polars array: a plain vector, with a validity bitmap (built a
/// word at a time) only if there is a null.
fn physical<T: PolarsNumericType, V: Copy + Default>(
    name: PlSmallStr,
    values: &[Option<V>],
    to: impl Fn(V) -> T::Native,
) -> ChunkedArray<T> {
    let plain = values.iter().map(|v| to(v.unwrap_or_default())).collect();
    if values.iter().all(Option::is_some) {
        ChunkedArray::<T>::from_vec(name, plain)
    } else {
        let valid = Bitmap::from_trusted_len_iter(values.iter().map(Option::is_some));
        ChunkedArray::<T>::from_vec_validity(name, plain, Some(valid))
    }
}

/// Converts a batch to a polars `DataFrame`.
fn dataframe(batch: Batch, enums: &mut Enums) -> anyhow::Result<DataFrame> {
    let mut cols = Vec::with_capacity(batch.columns.len());
    for (name, col) in batch.columns {
        let name = PlSmallStr::from_static(name);
        let s: Series = match col {
            Column::U64(v) => ChunkedArray::<UInt64Type>::from_vec(name, v).into_series(),
            Column::OptU64(v) => physical::<UInt64Type, u64>(name, &v, |x| x).into_series(),
            Column::I64(v) => ChunkedArray::<Int64Type>::from_vec(name, v).into_series(),
            Column::OptI64(v) => physical::<Int64Type, i64>(name, &v, |x| x).into_series(),
            Column::U32(v) => ChunkedArray::<UInt32Type>::from_vec(name, v).into_series(),
            Column::OptI32(v) => physical::<Int32Type, i32>(name, &v, |x| x).into_series(),
            Column::Dict(codes, dict) => enum_series(name, &codes, &dict, enums)?,
            Column::Binary(v) => v.into_iter().collect::<BinaryChunked>().with_name(name).into_series(),
            Column::Bool(v) => v.into_iter().map(Some).collect::<BooleanChunked>().with_name(name).into_series(),
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

/// A column's compressed pages: a list per Parquet leaf column (one for the flat columns written here).
type ColumnPages = Vec<Vec<CompressedPage>>;

/// How a table's columns are written, the same for every batch: known from its first batch's schema.
struct Layout {
    /// The Arrow schema as polars makes it (with its Enum metadata, so polars reads Enums back).
    schema: ArrowSchema,
    fields: Vec<ParquetType>,
    encodings: Vec<Vec<Encoding>>,
    options: WriteOptions,
}

impl Layout {
    fn new(df: &DataFrame) -> anyhow::Result<Self> {
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
        Ok(Layout { schema, fields, encodings, options })
    }

    /// Column `i` of a batch, encoded and compressed: its pages (a list per Parquet leaf column).
    fn encode(&self, i: usize, array: &ArrayRef) -> PolarsResult<ColumnPages> {
        let mut out = Vec::with_capacity(1);
        for pages in array_to_columns(array, self.fields[i].clone(), self.options, &self.encodings[i])? {
            let pages = pages.map(|p| p.map_err(|e| ParquetError::FeatureNotSupported(e.to_string())));
            let compressed = Compressor::new_from_vec(pages, self.options.compression, Vec::new());
            out.push(compressed.collect::<Result<_, _>>()?);
        }
        Ok(out)
    }
}

/// A batch of one table on its way to its file. Its columns are encoded and compressed by whichever of the
/// two threads claims them first (the builder between batches, the writer before writing), so the work is
/// shared by both cores whichever side is busier; then the writer writes them in order as one row group.
struct Job {
    table: Table,
    layout: Arc<Layout>,
    rows: u64,
    arrays: Vec<ArrayRef>,
    /// The next column to claim.
    next: AtomicUsize,
    /// Columns encoded so far, and each one's pages once done.
    done: Mutex<(usize, Vec<Option<PolarsResult<ColumnPages>>>)>,
    all_done: Condvar,
}

impl Job {
    fn new(table: Table, layout: Arc<Layout>, rows: usize, arrays: Vec<ArrayRef>) -> Self {
        let n = arrays.len();
        Job {
            table,
            layout,
            rows: rows as u64,
            arrays,
            next: AtomicUsize::new(0),
            done: Mutex::new((0, (0..n).map(|_| None).collect())),
            all_done: Condvar::new(),
        }
    }

    /// Encodes columns until none is left to claim.
    fn help(&self) {
        let n = self.arrays.len();
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return;
            }
            let pages = self.layout.encode(i, &self.arrays[i]);
            let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
            done.1[i] = Some(pages);
            done.0 += 1;
            if done.0 == n {
                self.all_done.notify_all();
            }
        }
    }

    /// Helps, then waits for the columns the other thread claimed: every column's pages, in order.
    fn pages(&self) -> anyhow::Result<ColumnPages> {
        self.help();
        let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        while done.0 < self.arrays.len() {
            done = self.all_done.wait(done).unwrap_or_else(PoisonError::into_inner);
        }
        let mut out = Vec::with_capacity(done.1.len());
        for column in done.1.iter_mut() {
            out.extend(column.take().expect("every column is done")?);
        }
        Ok(out)
    }
}

/// Writes one Parquet file per table into a directory, row group by row group, on the writer thread.
struct ParquetWriters {
    dir: PathBuf,
    files: HashMap<Table, FileWriter<BufWriter<File>>>,
    /// Every file created, under a temporary name until the export succeeded (dropped, they are removed).
    created: Vec<crate::output::Pending>,
    /// The trace being read, which no output may be.
    input: PathBuf,
}

impl ParquetWriters {
    /// Writes every file's footer, then renames every file into place.
    fn finish(&mut self) -> anyhow::Result<()> {
        for (t, mut f) in std::mem::take(&mut self.files) {
            f.end(None).with_context(|| format!("cannot finish {}.parquet", t.name()))?;
            let w = f.into_inner();
            w.into_inner().map_err(|e| e.into_error()).with_context(|| format!("cannot write {}.parquet", t.name()))?;
        }
        for p in self.created.drain(..) {
            p.commit()?;
        }
        Ok(())
    }

    /// Closes and removes every file created: a failed export leaves no table that looks whole, and the
    /// tables that were there before.
    fn discard(&mut self) {
        self.files.clear();
        self.created.clear();
    }

    fn write(&mut self, job: &Job) -> anyhow::Result<()> {
        let file = match self.files.entry(job.table) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let path = self.dir.join(format!("{}.parquet", job.table.name()));
                let (pending, f) = crate::output::Pending::create(&self.input, &path)?;
                self.created.push(pending);
                let w = FileWriter::try_new(
                    BufWriter::with_capacity(1 << 20, f),
                    job.layout.schema.clone(),
                    job.layout.options,
                )?;
                v.insert(w)
            }
        };
        // An empty table is a file with its schema and no row group (as polars writes it): a row group of no
        // rows would have column chunks without data pages.
        if job.rows == 0 {
            return Ok(());
        }
        let pages = job.pages()?;
        let columns = pages
            .iter()
            .map(|pages| Ok(DynStreamingIterator::new(fallible_streaming_iterator::convert(pages.iter().map(Ok)))));
        file.write(job.rows, DynIter::new(columns))?;
        Ok(())
    }
}

/// Hands batches to the writer thread as [`Job`]s, and shares their encoding with it: building the tables
/// overlaps with writing them. Two batches in flight at most besides the one being built, so memory stays
/// bounded.
struct Pipe {
    tx: std::sync::mpsc::SyncSender<Arc<Job>>,
    layouts: HashMap<Table, Arc<Layout>>,
    /// The last batch sent, which the writer may still be encoding.
    last: Option<Arc<Job>>,
    enums: Enums,
}

impl Sink for Pipe {
    fn batch(&mut self, table: Table, batch: Batch) -> anyhow::Result<()> {
        let df = dataframe(batch, &mut self.enums)?;
        let layout = match self.layouts.get(&table) {
            Some(l) => l.clone(),
            None => {
                let l = Arc::new(Layout::new(&df)?);
                self.layouts.insert(table, l.clone());
                l
            }
        };
        let mut jobs = Vec::new();
        for chunk in df.iter_chunks(CompatLevel::newest(), false) {
            jobs.push(Job::new(table, layout.clone(), chunk.len(), chunk.into_arrays()));
        }
        if jobs.is_empty() {
            // Every table gets its file, even without rows.
            jobs.push(Job::new(table, layout, 0, Vec::new()));
        }
        for job in jobs {
            let job = Arc::new(job);
            // While this batch was built, the writer encoded the last one: help it finish, so that the
            // channel has room, rather than wait.
            self.help();
            // A closed channel means the writer failed; its error is reported when it is joined.
            self.tx.send(job.clone()).map_err(|_| anyhow::anyhow!("the Parquet writer stopped"))?;
            self.last = Some(job);
        }
        Ok(())
    }
}

impl Pipe {
    /// Encodes what is left to claim of the last batch sent.
    fn help(&mut self) {
        if let Some(job) = self.last.take() {
            job.help();
        }
    }
}

/// Exports `path` into `dir` (created if missing) as events.parquet, calls.parquet, code.parquet,
/// lost.parquet, counter_samples.parquet, lines.parquet, functions.parquet, coroutines.parquet and
/// tasks.parquet. On an error, the files it created are removed (and `dir`, if it created that too).
pub fn export(path: &Path, opts: ReadOptions, dir: &Path) -> anyhow::Result<Summary> {
    crate::output::refuse_input(path, dir)?;
    for t in [
        Table::Code,
        Table::Calls,
        Table::Events,
        Table::Lost,
        Table::CounterSamples,
        Table::Lines,
        Table::Functions,
        Table::Coroutines,
        Table::Tasks,
        Table::Spans,
    ] {
        crate::output::refuse_input(path, &dir.join(format!("{}.parquet", t.name())))?;
    }
    let new_dir = !dir.exists();
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create directory {}", dir.display()))?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Arc<Job>>(1);
    let mut w =
        ParquetWriters { dir: dir.to_owned(), files: HashMap::default(), created: Vec::new(), input: path.to_owned() };
    // Set by the reading side when the tables could not be built, before it closes the channel.
    let failed = Arc::new(AtomicBool::new(false));
    let build_failed = failed.clone();
    let writer = std::thread::Builder::new().name("parquet-writer".into()).spawn(move || -> anyhow::Result<()> {
        let mut written = rx.iter().try_for_each(|job| w.write(&job));
        if written.is_ok() && !build_failed.load(Ordering::Acquire) {
            written = w.finish();
        }
        if written.is_err() || build_failed.load(Ordering::Acquire) {
            w.discard();
        }
        written
    })?;
    let mut pipe = Pipe { tx, layouts: HashMap::default(), last: None, enums: Enums::default() };
    let built = table::build(
        path,
        opts,
        &[
            Table::Code,
            Table::Lost,
            Table::Calls,
            Table::Events,
            Table::CounterSamples,
            Table::Lines,
            Table::Functions,
            Table::Coroutines,
            Table::Tasks,
            Table::Spans,
            Table::Spans,
        ],
        table::DEFAULT_BATCH_ROWS,
        &mut pipe,
    );
    pipe.help();
    failed.store(built.is_err(), Ordering::Release);
    drop(pipe);
    let written = writer.join().map_err(|_| anyhow::anyhow!("the Parquet writer panicked"))?;
    if new_dir && (written.is_err() || built.is_err()) {
        // Only if empty: the files were removed, and nothing else was there before.
        let _ = std::fs::remove_dir(dir);
    }
    // The writer's error explains a build that stopped because the writer did.
    written?;
    built
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_become_an_enum_with_nulls_and_a_code_outside_the_dictionary_is_an_error() {
        let dict = Arc::new(vec!["a".to_string(), "b".to_string()]);
        let mut enums = Enums::default();
        let s = enum_series("x".into(), &[1, NULL_CODE, 0, 1], &dict, &mut enums).unwrap();
        let strings = s.cast(&DataType::String).unwrap();
        let got: Vec<Option<String>> = (0..strings.len())
            .map(|i| match strings.get(i).unwrap() {
                polars::prelude::AnyValue::Null => None,
                v => Some(v.str_value().to_string()),
            })
            .collect();
        assert_eq!(got, [Some("b".into()), None, Some("a".into()), Some("b".into())]);
        // The same dictionary gives the same type, built once.
        let again = enum_series("y".into(), &[0], &dict, &mut enums).unwrap();
        assert_eq!(again.dtype(), s.dtype());
        assert_eq!(enums.0.len(), 1);
        let err = enum_series("x".into(), &[0, 2, NULL_CODE], &dict, &mut enums).unwrap_err();
        assert_eq!(err.to_string(), "column x: code 2 outside its dictionary of 2");
        let all_null = enum_series("x".into(), &[NULL_CODE; 3], &dict, &mut enums).unwrap();
        assert_eq!(all_null.null_count(), 3);
    }

    #[test]
    fn optional_integers_keep_their_nulls() {
        let ca = physical::<Int32Type, i32>("line".into(), &[Some(3), None, Some(-1), None, Some(7)], |x| x);
        let got: Vec<Option<i32>> = (0..ca.len()).map(|i| ca.get(i)).collect();
        assert_eq!(got, [Some(3), None, Some(-1), None, Some(7)]);
        let ca = physical::<Int32Type, i32>("line".into(), &[Some(1), Some(2)], |x| x);
        assert_eq!((ca.null_count(), ca.get(0), ca.get(1)), (0, Some(1), Some(2)));
    }
}
