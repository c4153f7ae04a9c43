//! A slab with a free list: rare, variable-size things (control messages, reads in flight)
//! live here and events carry only a `u32` index.

/// Slots reused after `take`.
#[derive(Debug)]
pub(crate) struct Store<T> {
    slots: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Store<T> {
    pub(crate) fn new() -> Self {
        Store {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Stores `v`, returning its index.
    pub(crate) fn put(&mut self, v: T) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(v);
                i
            }
            None => {
                self.slots.push(Some(v));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// A stored value.
    pub(crate) fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        self.slots.get_mut(i as usize).and_then(Option::as_mut)
    }

    /// Removes and returns a stored value.
    pub(crate) fn take(&mut self, i: u32) -> Option<T> {
        let v = self.slots.get_mut(i as usize).and_then(Option::take);
        if v.is_some() {
            self.free.push(i);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_slots() {
        let mut s = Store::new();
        let a = s.put(1);
        let b = s.put(2);
        assert_eq!(s.take(a), Some(1));
        assert_eq!(s.take(a), None);
        let c = s.put(3);
        assert_eq!(c, a);
        assert_eq!(s.get_mut(b), Some(&mut 2));
    }
}
