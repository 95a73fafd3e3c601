package vagrant

import (
	"context"

	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/provider"
)

// Constraints of vagrant machines: what a kloudvagrant_machine may ask of its owner's vagrant
// host, checked at plan time against what that host reports (vagrant.info: its CPUs, memory
// and architecture) and enforced by the Vagrantfile the host klient writes (Vagrant's docker
// provider: `docker create --memory --cpus`; box providers: the provider block's memory and cpus).
//
//	cores  cpus    integer  1 up to the host's CPUs
//	mem    memory  integer  64 MB up to the host's memory
//	arch   -       the host's (docker machines share its kernel; boxes are the host's arch here)
//
// There is no disk constraint: Vagrant's docker provider has no quota on a container's writable
// layer (overlay2 has one only on xfs with project quotas) and box disk sizes are an
// experimental Vagrant feature; the machine's disk is the host's.
//
// The bounds are the owner's host's, so provider.describe (which has no owner) shows the
// protocol's own limits, and ValidateConstraints of a stack with an owner asks the owner's host.
// An owner with no host connected is checked against the protocol's limits: the build then
// stops at ApplyTemplate, which says how to start a host.

// Constraints returns the vocabulary without a host: the bounds vagrant.create accepts.
func (v *Vagrant) Constraints() []provider.Constraint { return vocabulary(nil) }

// vocabulary is the constraints vocabulary, bounded by host h when known.
func vocabulary(h *klientapi.VagrantHostInfo) []provider.Constraint {
	vocab := []provider.Constraint{
		{Name: provider.ConstraintCores, Attribute: "cpus", Type: provider.ConstraintInteger, Unit: "CPUs",
			Min: provider.Bounds(1), Max: provider.Bounds(klientapi.VagrantMaxCPUs), Bound: "kloud's vagrant provider",
			Description: "CPUs of the machine, at most its owner's vagrant host's (checked at plan time); unset: the Vagrant provider's default"},
		{Name: provider.ConstraintMem, Attribute: "memory", Type: provider.ConstraintInteger, Unit: "MB",
			Min: provider.Bounds(klientapi.VagrantMinMemoryMB), Max: provider.Bounds(klientapi.VagrantMaxMemoryMB), Bound: "kloud's vagrant provider",
			Description: "memory of the machine in MiB, at most its owner's vagrant host's (checked at plan time); unset: the Vagrant provider's default"},
	}
	if h == nil {
		return vocab
	}
	if h.CPUs > 0 {
		vocab[0].Max, vocab[0].Bound = provider.Bounds(float64(min(h.CPUs, klientapi.VagrantMaxCPUs))), "your vagrant host"
	}
	if h.MemoryMB >= klientapi.VagrantMinMemoryMB {
		vocab[1].Max, vocab[1].Bound = provider.Bounds(float64(min(h.MemoryMB, klientapi.VagrantMaxMemoryMB))), "your vagrant host"
	}
	if h.Arch != "" {
		vocab = append(vocab, provider.Constraint{Name: provider.ConstraintArch, Type: provider.ConstraintString, Values: []string{h.Arch},
			Description: "the vagrant host's architecture"})
	}
	return vocab
}

// hostVocabulary is the vocabulary of the stack owner's host, asked once per stack (kloud
// validates every machine of a plan with one stack); without an owner or a connected host, the
// host-less one.
func (s *stack) hostVocabulary(ctx context.Context) []provider.Constraint {
	s.vocabOnce.Do(func() {
		s.vocab = vocabulary(nil)
		if s.B.Owner == "" {
			return
		}
		info, err := s.v.hostInfo(ctx, s.B.Owner)
		if err != nil {
			s.v.log.Warn("vagrant provider: constraints checked without the host's figures", "owner", s.B.Owner, "err", err)
			return
		}
		s.vocab = vocabulary(&info)
	})
	return s.vocab
}

// hostInfo asks owner's vagrant host what it has (vagrant.info).
func (v *Vagrant) hostInfo(ctx context.Context, owner string) (klientapi.VagrantHostInfo, error) {
	var info klientapi.VagrantHostInfo
	h, err := v.hosts.Host(ctx, owner, "")
	if err != nil {
		return info, err
	}
	err = v.call(ctx, h, klientapi.MethodVagrantInfo, klientapi.VagrantInfoParams{Token: h.Token}, &info)
	return info, err
}

// ValidateConstraints checks a kloudvagrant_machine's planned attributes against its owner's
// vagrant host.
func (s *stack) ValidateConstraints(ctx context.Context, attrs map[string]any) error {
	return provider.ValidateConstraints(s.hostVocabulary(ctx), attrs)
}

var _ provider.ConstraintsValidator = (*stack)(nil)
