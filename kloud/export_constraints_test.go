package kloud

import "context"

// CheckStackConstraints exposes checkStackConstraints to the external tests: stack id's
// machines as recorded, checked as stack.apply checks them before a build.
func (s *Server) CheckStackConstraints(ctx context.Context, id string) error {
	st, err := s.loadStack(ctx, nil, id)
	if err != nil {
		return err
	}
	return s.stacks.checkStackConstraints(ctx, st)
}
