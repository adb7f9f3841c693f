//! A map keyed by code id for the per-event work of a pass: code ids are small integers (the recorder
//! counts them from 1, FORMAT.md 6.1; C callables' ids sit in a range of their own, 6.11), so a table
//! indexed by the id finds an entry without hashing. The table grows with the entries, not with the ids:
//! an id far beyond what the map holds (a thread of a large program that calls a few functions, a crafted
//! file) goes through a hash map, so a pass with a map per thread of a hundred thousand threads holds
//! tables no larger than their entries.

use rustc_hash::FxHashMap as HashMap;

/// Ids below this can be looked up by index (4 bytes of table per id up to the largest indexed).
const DIRECT: u32 = 1 << 16;
/// Table entries a map may hold per entry of its own (plus this many): an id beyond goes to the hash map.
const SPARSENESS: usize = 64;
/// Where C callables' code ids begin (`ocular_format::CFunction::CODE_ID_BASE`).
const C_BASE: u32 = ocular_format::CFunction::CODE_ID_BASE;

/// Code id to `V`, entries kept in insertion order.
#[derive(Clone, Debug)]
pub struct CodeMap<V> {
    /// Position + 1 of the entry of code id `i` (0: none), for ids below [`DIRECT`].
    low: Vec<u32>,
    /// The same for C callables' ids, `C_BASE + i`.
    c: Vec<u32>,
    /// Position of any other id's entry (one that was beyond the tables when it was made).
    other: HashMap<u32, u32>,
    keys: Vec<u32>,
    values: Vec<V>,
}

impl<V> Default for CodeMap<V> {
    fn default() -> Self {
        CodeMap { low: Vec::new(), c: Vec::new(), other: HashMap::default(), keys: Vec::new(), values: Vec::new() }
    }
}

/// Where a table would hold `id`'s slot: in the C callables' table (`true`) or the other, at the index;
/// `None` for an id no table can hold.
#[inline(always)]
fn place(id: u32) -> Option<(bool, usize)> {
    if id < DIRECT {
        Some((false, id as usize))
    } else if id.wrapping_sub(C_BASE) < DIRECT {
        Some((true, (id - C_BASE) as usize))
    } else {
        None
    }
}

impl<V> CodeMap<V> {
    /// The table of C callables' ids (`c`) or the other one.
    #[inline(always)]
    fn table(&mut self, c: bool) -> &mut Vec<u32> {
        if c {
            &mut self.c
        } else {
            &mut self.low
        }
    }

    /// The table slot of `id`, if it has one.
    #[inline(always)]
    fn slot(&self, id: u32) -> Option<u32> {
        let direct = place(id).and_then(|(c, i)| if c { self.c.get(i) } else { self.low.get(i) });
        match direct {
            Some(&p) if p != 0 => Some(p),
            _ if self.other.is_empty() => None,
            _ => self.other.get(&id).map(|&p| p + 1),
        }
    }

    /// The position of `id`'s entry.
    #[inline(always)]
    fn position(&self, id: u32) -> Option<usize> {
        self.slot(id).map(|p| p as usize - 1)
    }

    #[inline(always)]
    pub fn get(&self, id: u32) -> Option<&V> {
        self.position(id).map(|p| &self.values[p])
    }

    #[inline(always)]
    pub fn get_mut(&mut self, id: u32) -> Option<&mut V> {
        self.position(id).map(|p| &mut self.values[p])
    }

    pub fn contains(&self, id: u32) -> bool {
        self.slot(id).is_some()
    }

    /// `id`'s entry, made with `make` if it has none.
    #[inline(always)]
    pub fn get_or_insert_with(&mut self, id: u32, make: impl FnOnce() -> V) -> &mut V {
        match self.position(id) {
            Some(p) => &mut self.values[p],
            None => self.insert_new(id, make()),
        }
    }

    /// Inserts `v` for `id`, which has no entry.
    #[cold]
    fn insert_new(&mut self, id: u32, v: V) -> &mut V {
        let pos = self.values.len() as u32;
        let limit = SPARSENESS * (self.keys.len() + 1);
        match place(id).filter(|&(_, i)| i < limit) {
            Some((c, i)) => {
                let table = self.table(c);
                if table.len() <= i {
                    table.resize((i + 1).next_power_of_two().max(64), 0);
                }
                table[i] = pos + 1;
            }
            None => {
                self.other.insert(id, pos);
            }
        }
        self.keys.push(id);
        self.values.push(v);
        self.values.last_mut().expect("pushed")
    }

    /// The position of `id`'s entry, a default one made if it has none: positions stay as they are until
    /// the map is drained.
    #[inline(always)]
    pub fn position_or_insert(&mut self, id: u32) -> usize
    where
        V: Default,
    {
        match self.position(id) {
            Some(p) => p,
            None => {
                self.insert_new(id, V::default());
                self.values.len() - 1
            }
        }
    }

    /// The entry at `position` ([`CodeMap::position_or_insert`]).
    #[inline(always)]
    pub fn at(&mut self, position: usize) -> &mut V {
        &mut self.values[position]
    }

    /// Sets `id`'s entry to `v`; whether it had none.
    pub fn insert(&mut self, id: u32, v: V) -> bool {
        match self.position(id) {
            Some(p) => {
                self.values[p] = v;
                false
            }
            None => {
                self.insert_new(id, v);
                true
            }
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The entries, in the order they were made.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &V)> {
        self.keys.iter().copied().zip(&self.values)
    }

    /// Removes every entry, handing them out in the order they were made (the tables keep their size).
    pub fn drain(&mut self) -> impl Iterator<Item = (u32, V)> + '_ {
        for k in 0..self.keys.len() {
            if let Some((c, i)) = place(self.keys[k]) {
                if let Some(slot) = self.table(c).get_mut(i) {
                    *slot = 0;
                }
            }
        }
        self.other.clear();
        self.keys.drain(..).zip(self.values.drain(..))
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.drain().for_each(drop);
    }

    /// The entries as a hash map.
    pub fn into_map(self) -> HashMap<u32, V> {
        self.keys.into_iter().zip(self.values).collect()
    }
}

impl<V: Default> CodeMap<V> {
    /// `id`'s entry, a default one made if it has none.
    #[inline(always)]
    pub fn entry(&mut self, id: u32) -> &mut V {
        self.get_or_insert_with(id, V::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_id_finds_its_own_entry_and_drain_empties_the_map() {
        let ids = [1, 7, DIRECT - 1, DIRECT, C_BASE, C_BASE + 5, C_BASE + DIRECT, u32::MAX, 0];
        let mut m = CodeMap::<u64>::default();
        for (k, &id) in ids.iter().enumerate() {
            *m.entry(id) += k as u64 + 1;
            *m.entry(id) += 100;
        }
        assert_eq!(m.len(), ids.len());
        for (k, &id) in ids.iter().enumerate() {
            assert_eq!(m.get(id), Some(&(k as u64 + 101)), "id {id:#x}");
        }
        assert_eq!(m.get(2), None);
        assert_eq!(m.get(C_BASE + 1), None);
        assert_eq!(m.get(DIRECT + 1), None);
        let drained: Vec<(u32, u64)> = m.drain().collect();
        assert_eq!(drained.iter().map(|d| d.0).collect::<Vec<_>>(), ids);
        assert!(m.is_empty());
        for &id in &ids {
            assert!(!m.contains(id), "id {id:#x} after drain");
        }
        assert!(m.insert(7, 3));
        assert!(!m.insert(7, 4));
        assert_eq!(m.into_map().get(&7), Some(&4));
    }

    #[test]
    fn tables_grow_with_the_entries_and_ids_hashed_before_are_found_after() {
        let mut m = CodeMap::<u32>::default();
        // A few entries of high ids: hashed, no table.
        for id in [5_000, 6_000, C_BASE + 9_000] {
            *m.entry(id) = id;
        }
        assert!(m.low.is_empty() && m.c.is_empty());
        // Many small ids: the table grows; with them, a higher id is indexed, the table now spanning the
        // ids hashed before.
        for id in 1..=200 {
            *m.entry(id) = id;
        }
        assert_eq!(m.low.len(), 256);
        *m.entry(7_000) = 7_000;
        assert!(m.low.len() > 7_000, "table of {}", m.low.len());
        for id in [5_000, 6_000, 7_000, C_BASE + 9_000, 1, 200] {
            assert_eq!(m.get(id), Some(&id), "id {id}");
        }
        assert_eq!(m.len(), 204);
        assert_eq!(m.drain().count(), 204);
        assert_eq!(m.get(5_000), None);
        assert_eq!(m.get(7_000), None);
    }

    #[test]
    fn a_crafted_large_id_takes_no_table_space() {
        let mut m = CodeMap::<u8>::default();
        m.entry(0x7fff_fff0);
        m.entry(C_BASE + 0x7fff_0000);
        assert!(m.low.is_empty() && m.c.is_empty());
        assert_eq!(m.len(), 2);
    }
}
