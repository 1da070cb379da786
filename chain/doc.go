// Package chain is cocoon's on-disk snapshot-chain format.
//
// A chain is a list of links, oldest first: one full link, then diffs. A link
// is a directory (and, in an image, one tar layer) holding:
//
//   - link.json: the manifest (Link). Its sha256 is the link's ID; a diff names
//     its parent by that ID, and the manifest records the digests of the two
//     memory files, so the ID covers the memory too.
//   - memory.extents: the (offset, length) list of the pages the link carries.
//   - memory.data: those pages' bytes, back to back in extent order.
//   - the hypervisor's state files, named in Link.StateFiles.
//
// A full link carries every non-zero page; a diff carries every page that
// differs from its parent, including pages that became zero. The format never
// relies on holes in its own files, so densifying or sparsifying copies (tar,
// registries) cannot change its meaning.
//
// memory.extents, format version 1, little-endian:
//
//	header  16 bytes: magic "COCOONEX", uint32 version (1), uint32 zero
//	record  16 bytes each: uint64 offset, uint64 length
//
// Records are whole pages, sorted by offset, non-overlapping, inside the
// memory, and adjacent ones are merged, so one memory has one encoding (and
// one link ID). Validate enforces all of it.
//
// Flatten replays a chain into one sparse memory file; WriteStaged and
// OpenStaged describe a chain staged for one restore; Pack writes a chain as
// an OCI image archive.
package chain
