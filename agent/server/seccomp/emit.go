package seccomp

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Offsets in struct seccomp_data, and the most a 32-bit load of an
// argument's half needs: the guest's architectures are little-endian, so
// an argument's low half comes first.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
	maxArgs = 6
)

// x32Bit flags an x32 call, which comes as an x86_64 one (the kernel's
// __X32_SYSCALL_BIT).
const x32Bit = 0x40000000

// runLen bounds a run of conditionless rules matched by one load: a
// conditional jump skips at most 255 instructions.
const runLen = 200

// rule is one match: a syscall by name, conditions that must all hold
// (none: any call), and what the filter then returns.
type rule struct {
	name  string
	conds []specs.LinuxSeccompArg
	ret   uint32
}

// compileRules turns the profile's syscalls into rules, in its order.
func compileRules(syscalls []specs.LinuxSyscall) ([]rule, error) {
	var out []rule
	for i, sc := range syscalls {
		ret, err := action(sc.Action, sc.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("seccomp syscalls[%d] %v: %w", i, sc.Names, err)
		}
		for _, c := range sc.Args {
			if err := checkArg(c); err != nil {
				return nil, fmt.Errorf("seccomp syscalls[%d] %v: %w", i, sc.Names, err)
			}
		}
		for _, name := range sc.Names {
			for _, conds := range condGroups(sc.Args) {
				out = append(out, rule{name: name, conds: conds, ret: ret})
			}
		}
	}
	return out, nil
}

func checkArg(c specs.LinuxSeccompArg) error {
	if c.Index >= maxArgs {
		return fmt.Errorf("argument index %d: a system call has %d", c.Index, maxArgs)
	}
	switch c.Op {
	case specs.OpEqualTo, specs.OpNotEqual, specs.OpGreaterThan, specs.OpGreaterEqual,
		specs.OpLessThan, specs.OpLessEqual, specs.OpMaskedEqual:
		return nil
	}
	return fmt.Errorf("argument operator %q: unknown", c.Op)
}

// condGroups are args as runc hands them to libseccomp: one rule of them
// all, or, when one argument is compared twice, a rule for each.
func condGroups(args []specs.LinuxSeccompArg) [][]specs.LinuxSeccompArg {
	seen := map[uint]bool{}
	for _, a := range args {
		if seen[a.Index] {
			groups := make([][]specs.LinuxSeccompArg, len(args))
			for i, a := range args {
				groups[i] = []specs.LinuxSeccompArg{a}
			}
			return groups
		}
		seen[a.Index] = true
	}
	return [][]specs.LinuxSeccompArg{args}
}

// program dispatches on the call's architecture to a block of rules each;
// an architecture not listed is killed.
func program(arches []archOf, rules []rule, def uint32) []bpf.Instruction {
	var ids []uint32
	blocks := map[uint32][]bpf.Instruction{}
	for _, a := range arches {
		id := uint32(a.info.ID)
		if _, ok := blocks[id]; !ok {
			ids = append(ids, id)
			blocks[id] = archBlock(id, arches, rules, def)
		}
	}
	prog := []bpf.Instruction{bpf.LoadAbsolute{Off: offArch, Size: 4}}
	head := 1 + 2*len(ids) + 1
	at := head
	for i, id := range ids {
		jump := len(prog) + 1
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: id, SkipFalse: 1},
			bpf.Jump{Skip: uint32(at - jump - 1)})
		at += len(blocks[ids[i]])
	}
	prog = append(prog, bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_THREAD})
	for _, id := range ids {
		prog = append(prog, blocks[id]...)
	}
	return prog
}

// archBlock matches the rules for the architectures of audit id: those
// that flag their numbers with a bit (x32) share it with one that does
// not, and are told apart by that bit.
func archBlock(id uint32, arches []archOf, rules []rule, def uint32) []bpf.Instruction {
	var plain, flagged []bpf.Instruction
	var bit uint32
	for _, a := range arches {
		switch {
		case uint32(a.info.ID) != id:
		case a.bit == 0:
			plain = append(matchRules(a, rules), bpf.RetConstant{Val: def})
		default:
			bit = a.bit
			flagged = append(matchRules(a, rules), bpf.RetConstant{Val: def})
		}
	}
	if bit == 0 && id == uint32(unix.AUDIT_ARCH_X86_64) {
		// x32 calls come as x86_64's with X32_SYSCALL_BIT: unlisted, killed.
		bit, flagged = x32Bit, []bpf.Instruction{bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_THREAD}}
	}
	if bit == 0 {
		return plain
	}
	if plain == nil {
		plain = []bpf.Instruction{bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_THREAD}}
	}
	out := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: bit, SkipFalse: 1},
		bpf.Jump{Skip: uint32(len(plain))},
	}
	return append(append(out, plain...), flagged...)
}

// matchRules matches rules in order for a's calls; a syscall a's table
// does not know is skipped, as libseccomp skips it for runc.
func matchRules(a archOf, rules []rule) []bpf.Instruction {
	var out []bpf.Instruction
	for i := 0; i < len(rules); {
		r := rules[i]
		if len(r.conds) > 0 {
			if nr, ok := a.info.SyscallNames[r.name]; ok {
				out = append(out, conditional(uint32(nr)|a.bit, r)...)
			}
			i++
			continue
		}
		var nrs []uint32
		for ; i < len(rules) && len(rules[i].conds) == 0 && rules[i].ret == r.ret && len(nrs) < runLen; i++ {
			if nr, ok := a.info.SyscallNames[rules[i].name]; ok {
				nrs = append(nrs, uint32(nr)|a.bit)
			}
		}
		out = append(out, anyOf(nrs, r.ret)...)
	}
	return out
}

// anyOf returns ret for a call numbered one of nrs.
func anyOf(nrs []uint32, ret uint32) []bpf.Instruction {
	if len(nrs) == 0 {
		return nil
	}
	out := []bpf.Instruction{bpf.LoadAbsolute{Off: offNr, Size: 4}}
	for i, nr := range nrs {
		out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipTrue: uint8(len(nrs) - i)})
	}
	return append(out, bpf.Jump{Skip: 1}, bpf.RetConstant{Val: ret})
}

// conditional returns r's action for call nr when all of r's conditions
// hold; else the next rule decides.
func conditional(nr uint32, r rule) []bpf.Instruction {
	body := []bpf.Instruction{bpf.RetConstant{Val: r.ret}}
	for i := len(r.conds) - 1; i >= 0; i-- {
		body = append(compare(r.conds[i], len(body)), body...)
	}
	return append([]bpf.Instruction{
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: uint8(len(body))},
	}, body...)
}

// compare checks one condition on a 64-bit argument, half by half. It
// falls through when the condition holds and skips the after instructions
// that follow it when not.
func compare(c specs.LinuxSeccompArg, after int) []bpf.Instruction {
	lo := bpf.LoadAbsolute{Off: offArgs + 8*uint32(c.Index), Size: 4}
	hi := bpf.LoadAbsolute{Off: lo.Off + 4, Size: 4}
	vlo, vhi := uint32(c.Value), uint32(c.Value>>32)
	// seq's jumps are written as ok (0) or fail; fail is resolved below.
	const fail = 0xff
	var seq []bpf.Instruction
	switch c.Op {
	case specs.OpEqualTo:
		seq = []bpf.Instruction{hi, jeq(vhi, 0, fail), lo, jeq(vlo, 0, fail)}
	case specs.OpNotEqual:
		seq = []bpf.Instruction{hi, jeq(vhi, 0, 2), lo, jeq(vlo, fail, 0)}
	case specs.OpMaskedEqual:
		mlo, mhi := uint32(c.Value), uint32(c.Value>>32)
		wlo, whi := uint32(c.ValueTwo), uint32(c.ValueTwo>>32)
		seq = []bpf.Instruction{hi, and(mhi), jeq(whi, 0, fail), lo, and(mlo), jeq(wlo, 0, fail)}
	case specs.OpGreaterThan, specs.OpGreaterEqual:
		last := bpf.JumpGreaterThan
		if c.Op == specs.OpGreaterEqual {
			last = bpf.JumpGreaterOrEqual
		}
		seq = []bpf.Instruction{hi, jump(bpf.JumpGreaterThan, vhi, 3, 0), jeq(vhi, 0, fail), lo, jump(last, vlo, 0, fail)}
	case specs.OpLessThan, specs.OpLessEqual:
		last := bpf.JumpGreaterOrEqual
		if c.Op == specs.OpLessEqual {
			last = bpf.JumpGreaterThan
		}
		seq = []bpf.Instruction{hi, jump(bpf.JumpGreaterThan, vhi, fail, 0), jeq(vhi, 0, 2), lo, jump(last, vlo, fail, 0)}
	}
	for i, in := range seq {
		if j, ok := in.(bpf.JumpIf); ok {
			toFail := uint8(len(seq) - 1 - i + after)
			if j.SkipTrue == fail {
				j.SkipTrue = toFail
			}
			if j.SkipFalse == fail {
				j.SkipFalse = toFail
			}
			seq[i] = j
		}
	}
	return seq
}

func jeq(v uint32, t, f uint8) bpf.Instruction { return jump(bpf.JumpEqual, v, t, f) }

func jump(c bpf.JumpTest, v uint32, t, f uint8) bpf.Instruction {
	return bpf.JumpIf{Cond: c, Val: v, SkipTrue: t, SkipFalse: f}
}

func and(v uint32) bpf.Instruction { return bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: v} }
