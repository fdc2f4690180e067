//! The prefix index of the KV block pool: a radix tree over token ids at block granularity that
//! maps every resident *full* KV block to the exact token sequence that produced it, so a new
//! sequence whose prompt starts with an indexed prefix can take references on those blocks
//! instead of recomputing them.
//!
//! Design: SGLang's RadixAttention (Zheng et al., 2024) at the granularity of vLLM's
//! PagedAttention blocks (Kwon et al., 2023), as §6.3 of the model-memory chapter proposes: a
//! path from a root to a node spells `tokens_per_block × depth` tokens, each edge being one
//! block's token ids, and the node holds the [`BlockId`] whose K/V rows those tokens produced.
//! (Path compression buys nothing here: every edge already is one block.) Lookups descend
//! block by block through a hash map keyed by (parent, hash of the edge's tokens), verifying
//! the tokens, then look for the longest token-level match among the last node's children so
//! the pool can copy the matching rows of a partially matching block.
//!
//! Scoping: every cache salt (an optional per-tenant key) has its own root, so a lookup under
//! one salt can never reach, and therefore never reveal, blocks indexed under another.
//!
//! Eviction: the index does not own blocks; the pool tells it when an indexed block loses its
//! last reference ([`PrefixIndex::set_cached`]). Cached *leaves* are kept in least-recently-used
//! order and [`PrefixIndex::pop_lru`] removes the oldest, which keeps the tree well formed
//! (a parent is only removed after its children). The pool guarantees that a cached node has
//! only cached descendants (whoever holds a node's block holds its ancestors' blocks too), so
//! every cached block is eventually reclaimable.
//!
//! Storage: nodes live in a flat `Vec` linked by `u32` indices (parent, first child, siblings),
//! with a free list of node slots. Cost: `child` is O(tokens_per_block) (one hash and one
//! comparison), `insert` O(tokens_per_block), `best_partial` O(children × tokens_per_block),
//! `set_cached`/`touch`/`pop_lru` O(log cached) (a `BTreeSet` ordered by last use).

use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;

use crate::kv_pool::BlockId;

/// Index of a node of the prefix tree (roots included).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Node {
    /// `NIL` for a root.
    parent: u32,
    /// The block holding this node's K/V rows (`BlockId(NIL)` for a root).
    block: BlockId,
    /// The edge label: this block's token ids (empty for a root).
    tokens: Box<[u32]>,
    first_child: u32,
    next_sibling: u32,
    prev_sibling: u32,
    children: u32,
    /// Blocks from the root (a root is 0).
    depth: u32,
    /// Logical time of the last lookup hit, insertion or release.
    last_used: u64,
    /// The block has no reference from any sequence (only the index keeps it).
    cached: bool,
    /// The slot holds a node (false on the free list).
    live: bool,
    /// The salt key of a root (empty otherwise).
    root_key: Box<[u8]>,
}

/// A read-only view of one indexed node (for audits and statistics).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NodeView<'a> {
    pub id: NodeId,
    /// `None` for a node directly under a root.
    pub parent: Option<NodeId>,
    pub block: BlockId,
    pub tokens: &'a [u32],
    pub depth: u32,
    pub children: u32,
    pub cached: bool,
    pub last_used: u64,
}

/// The radix prefix index (see the module documentation).
#[derive(Debug)]
pub struct PrefixIndex {
    tokens_per_block: usize,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    /// Salt key (see [`salt_key`]) → root node.
    roots: HashMap<Box<[u8]>, u32>,
    /// (parent, hash of the child's tokens) → child.
    children: HashMap<(u32, u64), u32>,
    hasher: RandomState,
    /// Cached leaves by (last use, node): the eviction order.
    evictable: BTreeSet<(u64, u32)>,
    /// Non-root nodes.
    indexed: usize,
    /// Non-root nodes whose block is unreferenced.
    cached: usize,
}

/// The root key of a salt: salts are scoped exactly (no hashing, so no collisions between
/// tenants); `None` and `Some(&[])` are distinct.
fn salt_key(salt: Option<&[u8]>) -> Vec<u8> {
    match salt {
        None => vec![0],
        Some(s) => {
            let mut k = Vec::with_capacity(s.len() + 1);
            k.push(1);
            k.extend_from_slice(s);
            k
        }
    }
}

impl PrefixIndex {
    /// An empty index whose edges are `tokens_per_block` tokens long.
    pub fn new(tokens_per_block: usize) -> PrefixIndex {
        assert!(tokens_per_block > 0, "tokens_per_block must be positive");
        PrefixIndex {
            tokens_per_block,
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            roots: HashMap::new(),
            children: HashMap::new(),
            hasher: RandomState::new(),
            evictable: BTreeSet::new(),
            indexed: 0,
            cached: 0,
        }
    }

    /// Indexed blocks (non-root nodes).
    pub fn len(&self) -> usize {
        self.indexed
    }

    pub fn is_empty(&self) -> bool {
        self.indexed == 0
    }

    /// Indexed blocks that no sequence references.
    pub fn cached_len(&self) -> usize {
        self.cached
    }

    fn hash(&self, tokens: &[u32]) -> u64 {
        self.hasher.hash_one(tokens)
    }

    fn node(&self, id: NodeId) -> &Node {
        let n = &self.nodes[id.0 as usize];
        debug_assert!(n.live, "stale node id {id:?}");
        n
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        let n = &mut self.nodes[id.0 as usize];
        debug_assert!(n.live, "stale node id {id:?}");
        n
    }

    fn alloc_node(&mut self, node: Node) -> u32 {
        match self.free_nodes.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 index nodes")
            }
        }
    }

    /// The root of `salt`, if anything is indexed under it.
    pub fn find_root(&self, salt: Option<&[u8]>) -> Option<NodeId> {
        self.roots
            .get(salt_key(salt).as_slice())
            .map(|&r| NodeId(r))
    }

    /// The root of `salt`, created if needed.
    pub fn root(&mut self, salt: Option<&[u8]>) -> NodeId {
        if let Some(r) = self.find_root(salt) {
            return r;
        }
        let key: Box<[u8]> = salt_key(salt).into_boxed_slice();
        let id = self.alloc_node(Node {
            parent: NIL,
            block: BlockId(NIL),
            tokens: Box::new([]),
            first_child: NIL,
            next_sibling: NIL,
            prev_sibling: NIL,
            children: 0,
            depth: 0,
            last_used: 0,
            cached: false,
            live: true,
            root_key: key.clone(),
        });
        self.roots.insert(key, id);
        NodeId(id)
    }

    /// The child of `parent` whose edge is exactly `tokens` (one block's worth).
    pub fn child(&self, parent: NodeId, tokens: &[u32]) -> Option<NodeId> {
        if tokens.len() != self.tokens_per_block {
            return None;
        }
        let &c = self.children.get(&(parent.0, self.hash(tokens)))?;
        // A 64-bit hash collision only hides a node; it can never return wrong tokens.
        (*self.nodes[c as usize].tokens == *tokens).then_some(NodeId(c))
    }

    /// The child of `parent` sharing the longest run of leading tokens with `tokens`, at most
    /// `limit` (and fewer than a whole block's, which [`child`](Self::child) finds): returns the
    /// child and the number of matching tokens, if at least one matches.
    pub fn best_partial(
        &self,
        parent: NodeId,
        tokens: &[u32],
        limit: usize,
    ) -> Option<(NodeId, usize)> {
        let limit = limit.min(tokens.len()).min(self.tokens_per_block);
        if limit == 0 {
            return None;
        }
        let mut best: Option<(NodeId, usize)> = None;
        let mut c = self.node(parent).first_child;
        while c != NIL {
            let n = &self.nodes[c as usize];
            let common = n
                .tokens
                .iter()
                .zip(&tokens[..limit])
                .take_while(|(a, b)| a == b)
                .count();
            if common > best.map_or(0, |b| b.1) {
                best = Some((NodeId(c), common));
                if common == limit {
                    break;
                }
            }
            c = n.next_sibling;
        }
        best
    }

    /// Index `block` as the child of `parent` spelled by `tokens` (a whole block's worth, not
    /// yet indexed under `parent`). The new node starts referenced (not cached).
    pub fn insert(&mut self, parent: NodeId, tokens: &[u32], block: BlockId, tick: u64) -> NodeId {
        assert_eq!(tokens.len(), self.tokens_per_block, "an edge is one block");
        let h = self.hash(tokens);
        assert!(
            !self.children.contains_key(&(parent.0, h)),
            "the child is already indexed (or its hash collides)"
        );
        let p = self.node(parent);
        assert!(!p.cached, "a cached node cannot gain children");
        let (depth, old_first) = (p.depth + 1, p.first_child);
        let id = self.alloc_node(Node {
            parent: parent.0,
            block,
            tokens: tokens.into(),
            first_child: NIL,
            next_sibling: old_first,
            prev_sibling: NIL,
            children: 0,
            depth,
            last_used: tick,
            cached: false,
            live: true,
            root_key: Box::new([]),
        });
        if old_first != NIL {
            self.nodes[old_first as usize].prev_sibling = id;
        }
        let p = self.node_mut(parent);
        p.first_child = id;
        p.children += 1;
        self.children.insert((parent.0, h), id);
        self.indexed += 1;
        NodeId(id)
    }

    /// Whether `tokens` could be inserted under `parent` (no child with the same hash).
    pub fn can_insert(&self, parent: NodeId, tokens: &[u32]) -> bool {
        tokens.len() == self.tokens_per_block
            && !self.children.contains_key(&(parent.0, self.hash(tokens)))
    }

    /// The block of an indexed node.
    pub fn block(&self, id: NodeId) -> BlockId {
        self.node(id).block
    }

    /// Record a use of `id` at logical time `tick` (LRU order).
    pub fn touch(&mut self, id: NodeId, tick: u64) {
        let n = self.node(id);
        if n.parent == NIL {
            return;
        }
        let (old, evictable) = (n.last_used, n.cached && n.children == 0);
        if evictable {
            self.evictable.remove(&(old, id.0));
            self.evictable.insert((tick, id.0));
        }
        self.node_mut(id).last_used = tick;
    }

    /// Record whether the block of `id` is unreferenced (`cached`) or held by a sequence.
    pub fn set_cached(&mut self, id: NodeId, cached: bool, tick: u64) {
        let n = self.node(id);
        if n.cached == cached {
            return;
        }
        let (last, leaf) = (n.last_used, n.children == 0);
        if cached {
            self.cached += 1;
            let n = self.node_mut(id);
            n.cached = true;
            n.last_used = tick;
            if leaf {
                self.evictable.insert((tick, id.0));
            }
        } else {
            self.cached -= 1;
            if leaf {
                self.evictable.remove(&(last, id.0));
            }
            self.node_mut(id).cached = false;
        }
    }

    /// Remove the least recently used cached leaf and return its block (now unindexed).
    pub fn pop_lru(&mut self) -> Option<BlockId> {
        let (_, id) = self.evictable.pop_first()?;
        Some(self.remove_leaf(id))
    }

    fn remove_leaf(&mut self, id: u32) -> BlockId {
        let n = &self.nodes[id as usize];
        debug_assert!(n.live && n.children == 0 && n.parent != NIL);
        let (parent, prev, next, block) = (n.parent, n.prev_sibling, n.next_sibling, n.block);
        let h = self.hash(&n.tokens);
        self.children.remove(&(parent, h));
        if prev != NIL {
            self.nodes[prev as usize].next_sibling = next;
        } else {
            self.nodes[parent as usize].first_child = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev_sibling = prev;
        }
        if self.nodes[id as usize].cached {
            self.cached -= 1;
        }
        self.indexed -= 1;
        let slot = &mut self.nodes[id as usize];
        slot.live = false;
        slot.tokens = Box::new([]);
        self.free_nodes.push(id);

        let p = &mut self.nodes[parent as usize];
        p.children -= 1;
        if p.children == 0 {
            if p.parent == NIL {
                // An empty root: forget the salt.
                let key = std::mem::take(&mut p.root_key);
                p.live = false;
                self.roots.remove(&key);
                self.free_nodes.push(parent);
            } else if p.cached {
                self.evictable.insert((p.last_used, parent));
            }
        }
        block
    }

    /// Every indexed (non-root) node.
    pub fn nodes(&self) -> impl Iterator<Item = NodeView<'_>> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.live && n.parent != NIL)
            .map(|(i, n)| NodeView {
                id: NodeId(i as u32),
                parent: (self.nodes[n.parent as usize].parent != NIL).then_some(NodeId(n.parent)),
                block: n.block,
                tokens: &n.tokens,
                depth: n.depth,
                children: n.children,
                cached: n.cached,
                last_used: n.last_used,
            })
    }

    /// Checks the tree's structural invariants: child links, counts, the evictable set (exactly
    /// the cached leaves), and that cached nodes have only cached descendants.
    pub fn audit(&self) -> Result<(), String> {
        let mut indexed = 0;
        let mut cached = 0;
        let mut evictable = 0;
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.live {
                continue;
            }
            let i = i as u32;
            // Children list agrees with the count and the parent links.
            let mut count = 0;
            let mut c = n.first_child;
            let mut prev = NIL;
            while c != NIL {
                let cn = &self.nodes[c as usize];
                if !cn.live || cn.parent != i || cn.prev_sibling != prev {
                    return Err(format!("node {i}: broken child list at {c}"));
                }
                if n.cached && !cn.cached {
                    return Err(format!("cached node {i} has referenced child {c}"));
                }
                count += 1;
                prev = c;
                c = cn.next_sibling;
            }
            if count != n.children {
                return Err(format!(
                    "node {i}: {count} children listed, {} counted",
                    n.children
                ));
            }
            if n.parent == NIL {
                if self.roots.get(&n.root_key) != Some(&i) {
                    return Err(format!("root {i} is not registered"));
                }
                if n.children == 0 {
                    return Err(format!("root {i} is empty"));
                }
                continue;
            }
            indexed += 1;
            let h = self.hash(&n.tokens);
            if self.children.get(&(n.parent, h)) != Some(&i) {
                return Err(format!("node {i} is missing from the child map"));
            }
            if n.depth != self.nodes[n.parent as usize].depth + 1 {
                return Err(format!("node {i}: wrong depth"));
            }
            cached += usize::from(n.cached);
            let should = n.cached && n.children == 0;
            if should != self.evictable.contains(&(n.last_used, i)) {
                return Err(format!("node {i}: evictable set disagrees"));
            }
            evictable += usize::from(should);
        }
        if indexed != self.indexed || cached != self.cached {
            return Err("node counts disagree".into());
        }
        if evictable != self.evictable.len() || self.children.len() != indexed {
            return Err("evictable set or child map has stale entries".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_scoped_by_salt_and_verify_tokens() {
        let mut ix = PrefixIndex::new(2);
        let a = ix.root(Some(b"tenant-a"));
        let n1 = ix.insert(a, &[1, 2], BlockId(7), 1);
        assert_eq!(ix.child(a, &[1, 2]), Some(n1));
        assert_eq!(ix.child(a, &[1, 3]), None);
        assert_eq!(ix.find_root(Some(b"tenant-b")), None);
        assert_eq!(ix.find_root(None), None);
        let b = ix.root(Some(b"tenant-b"));
        assert_eq!(ix.child(b, &[1, 2]), None);
        ix.insert(b, &[1, 2], BlockId(8), 2);
        ix.audit().unwrap();
        assert_eq!(ix.best_partial(a, &[1, 9], 2), Some((n1, 1)));
        assert_eq!(ix.best_partial(a, &[1, 2], 1), Some((n1, 1)));
        assert_eq!(ix.best_partial(a, &[5, 2], 2), None);
    }

    #[test]
    fn eviction_takes_least_recently_used_leaves_first() {
        let mut ix = PrefixIndex::new(1);
        let r = ix.root(None);
        let a = ix.insert(r, &[1], BlockId(0), 1);
        let b = ix.insert(a, &[2], BlockId(1), 2);
        let c = ix.insert(r, &[3], BlockId(2), 3);
        ix.set_cached(b, true, 4);
        ix.set_cached(a, true, 5);
        ix.set_cached(c, true, 6);
        ix.audit().unwrap();
        assert_eq!(ix.cached_len(), 3);
        ix.touch(b, 10); // b is now the most recent leaf; a is not a leaf yet
        assert_eq!(ix.pop_lru(), Some(BlockId(2)));
        assert_eq!(ix.pop_lru(), Some(BlockId(1)));
        assert_eq!(ix.pop_lru(), Some(BlockId(0)));
        assert_eq!(ix.pop_lru(), None);
        assert!(ix.is_empty());
        assert_eq!(ix.find_root(None), None, "empty roots are dropped");
        ix.audit().unwrap();
    }
}
