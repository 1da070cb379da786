package cloudhypervisor

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// A snapshot's config.json comes from its image, and Cloud Hypervisor
// opens whatever host files, sockets, devices and tap interfaces it names
// when it restores. So every field is classified here, from VmConfig in
// the API spec (shared/specs/cloud-hypervisor*.yaml) and from the struct
// v53.0 serializes (vmm/src/vm_config.rs, which adds fields and names
// generic_vhost_user with an underscore): a field that names something on
// the host is rewritten to this VM's own (rewrite), dropped when a restore
// needs none and the node decides (drop), or else the restore is refused
// (refuse). A field the table does not know is kept only if it holds no
// string, since a string may be a host path.

// rule is what the rewrite does with one field.
type rule int

const (
	// keep: names nothing on the host.
	keep rule = iota
	// rewrite: set by patchConfig to this VM's run directory or to the
	// values the restore was given.
	rewrite
	// drop: set to null. Payload files are only read to boot, and host
	// CPU and NUMA placement is the node's to decide.
	drop
	// refuse: names a host path, socket, device or descriptor cocoon has
	// no replacement for; only an absent or empty value is accepted.
	refuse
)

// field is the schema of one field: a rule, or for an object (or each
// element of an array of objects) the schema of its fields.
type field struct {
	rule   rule
	fields map[string]field
}

// obj is the schema of an object (or of each element of an array of
// objects) with the given fields; a field it does not list is unknown.
func obj(fields map[string]field) field { return field{fields: fields} }

var (
	keepField    = field{rule: keep}
	rewriteField = field{rule: rewrite}
	dropField    = field{rule: drop}
	refuseField  = field{rule: refuse}
)

// pciCommon are the PCI placement fields many devices flatten in.
func pciCommon(fields map[string]field) field {
	for _, f := range []string{"id", "iommu", "pci_segment", "pci_device_id"} {
		fields[f] = keepField
	}
	return obj(fields)
}

// vmConfigSchema is config.json's schema; a field with a rule gets it
// for its whole value, an object is checked field by field.
var vmConfigSchema = obj(map[string]field{
	"cpus": obj(map[string]field{
		"boot_vcpus": keepField, "max_vcpus": keepField, "topology": keepField, "kvm_hyperv": keepField,
		"max_phys_bits": keepField, "affinity": dropField, "features": keepField, "nested": keepField,
		"core_scheduling": keepField, "profile": keepField,
	}),
	"memory": obj(map[string]field{
		"size": keepField, "mergeable": keepField, "hotplug_method": keepField, "hotplug_size": keepField,
		"hotplugged_size": keepField, "shared": keepField, "hugepages": keepField, "hugepage_size": keepField,
		"prefault": keepField, "reserve": keepField, "thp": keepField,
		"zones": obj(map[string]field{
			"id": keepField, "size": keepField, "file": refuseField, "shared": keepField, "hugepages": keepField,
			"hugepage_size": keepField, "host_numa_node": dropField, "hotplug_size": keepField,
			"hotplugged_size": keepField, "prefault": keepField, "reserve": keepField, "mergeable": keepField,
		}),
	}),
	"payload": obj(map[string]field{
		"firmware": dropField, "kernel": dropField, "initramfs": dropField, "igvm": dropField,
		"cmdline": keepField, "host_data": keepField,
		"fw_cfg_config": obj(map[string]field{
			"e820": keepField, "kernel": keepField, "cmdline": keepField, "initramfs": keepField, "acpi_tables": keepField,
			"items": obj(map[string]field{
				"item_list": obj(map[string]field{"name": keepField, "file": refuseField, "string": keepField}),
			}),
		}),
	}),
	"rate_limit_groups": obj(map[string]field{"id": keepField, "rate_limiter_config": keepField}),
	"disks": pciCommon(map[string]field{
		"path": rewriteField, "readonly": keepField, "direct": keepField, "num_queues": keepField,
		"queue_size": keepField, "vhost_user": refuseField, "vhost_socket": refuseField,
		"rate_limit_group": keepField, "rate_limiter_config": keepField, "disable_io_uring": keepField,
		"disable_aio": keepField, "serial": keepField, "queue_affinity": dropField,
		"backing_files": refuseField, "sparse": keepField, "image_type": keepField, "lock_granularity": keepField,
	}),
	"net": pciCommon(map[string]field{
		"tap": rewriteField, "ip": dropField, "mask": dropField, "mac": keepField, "host_mac": dropField,
		"mtu": keepField, "num_queues": keepField, "queue_size": keepField, "vhost_user": refuseField,
		"vhost_socket": refuseField, "vhost_mode": keepField, "fds": refuseField, "rate_limiter_config": keepField,
		"offload_tso": keepField, "offload_ufo": keepField, "offload_csum": keepField,
	}),
	"rng": pciCommon(map[string]field{"src": rewriteField}),
	"balloon": pciCommon(map[string]field{
		"size": keepField, "deflate_on_oom": keepField, "free_page_reporting": keepField,
	}),
	"generic_vhost_user": refuseField, "generic-vhost-user": refuseField,
	"fs": refuseField, "pmem": refuseField, "devices": refuseField, "user_devices": refuseField,
	"vdpa": refuseField, "tpm": refuseField, "landlock_rules": refuseField, "ivshmem": refuseField,
	"preserved_fds": refuseField,
	"serial":        obj(map[string]field{"file": rewriteField, "socket": rewriteField, "mode": keepField}),
	"console": pciCommon(map[string]field{
		"file": rewriteField, "socket": rewriteField, "mode": keepField,
	}),
	"debug_console": obj(map[string]field{"file": rewriteField, "mode": keepField, "iobase": keepField}),
	"vsock":         pciCommon(map[string]field{"cid": keepField, "socket": rewriteField}),
	// Guest-side settings: numa names guest CPUs and zones, not host ones.
	"pvmemcontrol": keepField, "pvpanic": keepField, "iommu": keepField, "watchdog": keepField,
	"gdb": keepField, "landlock_enable": keepField, "numa": keepField, "rtc": keepField,
	"pci_segments": keepField,
	"platform": obj(map[string]field{
		"num_pci_segments": keepField, "iommu_segments": keepField, "iommu_address_width_bits": keepField,
		"system_serial_number": keepField, "serial_number": keepField, "system_uuid": keepField,
		"uuid": keepField, "oem_strings": keepField, "system_manufacturer": keepField,
		"system_product_name": keepField, "system_version": keepField, "system_family": keepField,
		"system_sku_number": keepField, "chassis_asset_tag": keepField, "tdx": keepField,
		"sev_snp": keepField, "iommufd": keepField, "iommufd_fd": refuseField, "vfio_p2p_dma": keepField,
	}),
})

// sanitize applies f's schema to raw at path: it drops the drop fields
// and fails on a refuse field that is set or an unknown field holding a
// string; rewrite fields are left for patchConfig.
func sanitize(path string, raw json.RawMessage, f field) (json.RawMessage, error) {
	if f.fields == nil {
		switch {
		case f.rule == drop:
			return json.RawMessage("null"), nil
		case f.rule == refuse && !isEmpty(raw):
			return nil, fmt.Errorf("%s = %s: names a host path, socket, device or descriptor, which a restore cannot take from an image", path, raw)
		}
		return raw, nil
	}
	if isNull(raw) {
		return raw, nil
	}
	var elems []json.RawMessage
	if json.Unmarshal(raw, &elems) == nil {
		for i, e := range elems {
			var err error
			if elems[i], err = sanitize(fmt.Sprintf("%s[%d]", path, i), e, f); err != nil {
				return nil, err
			}
		}
		return json.Marshal(elems)
	}
	var o map[string]json.RawMessage
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, fmt.Errorf("%s: want an object or an array of objects: %w", path, err)
	}
	for _, k := range slices.Sorted(maps.Keys(o)) {
		child, ok := f.fields[k]
		name := k
		if path != "" {
			name = path + "." + k
		}
		if !ok {
			if holdsString(o[k]) {
				return nil, fmt.Errorf("%s: an unknown field holding a string, which may name a host path", name)
			}
			continue
		}
		var err error
		if o[k], err = sanitize(name, o[k], child); err != nil {
			return nil, err
		}
	}
	return json.Marshal(o)
}

// isEmpty reports whether raw is null, false, "", [] or {}.
func isEmpty(raw json.RawMessage) bool {
	switch string(raw) {
	case "", "null", "false", `""`, "[]", "{}":
		return true
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	switch v := v.(type) {
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	}
	return false
}

// holdsString reports whether the JSON value raw is or contains a string
// (object keys aside).
func holdsString(raw json.RawMessage) bool {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return true
	}
	return anyString(v)
}

func anyString(v any) bool {
	switch v := v.(type) {
	case string:
		return true
	case []any:
		return slices.ContainsFunc(v, anyString)
	case map[string]any:
		for _, e := range v {
			if anyString(e) {
				return true
			}
		}
	}
	return false
}
