package session

import (
	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// Settings is the fold of a session's mutable settings over its log: the
// header's creation options with every session/model, approval/policy,
// approval/decided added rule and sandbox/mode applied, and the last
// session/title.
type Settings struct {
	// Options are the effective options; shared, must not be mutated.
	Options *sessionv1.SessionOptions
	// Title is the last session/title's title ("" when none).
	Title string
	// ModelSeq is the seq of the last session/model event (-1 when none).
	ModelSeq int64
}

// settingsFold maintains [Settings] incrementally. Each change replaces
// Options with a fresh copy, so a Settings handed out stays unchanged.
type settingsFold struct {
	s Settings
}

func newSettingsFold(h *sessionv1.SessionHeader) settingsFold {
	o := h.GetOptions()
	if o == nil {
		o = &sessionv1.SessionOptions{}
	}
	return settingsFold{s: Settings{Options: o, ModelSeq: -1}}
}

// apply folds one committed event.
func (f *settingsFold) apply(ev *sessionv1.SessionEvent) {
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_ModelChanged:
		o := proto.CloneOf(f.s.Options)
		o.Provider, o.Model = p.ModelChanged.GetProvider(), p.ModelChanged.GetModel()
		f.s.Options, f.s.ModelSeq = o, ev.GetSeq()
	case *sessionv1.SessionEvent_ApprovalPolicy:
		o := proto.CloneOf(f.s.Options)
		o.Approval = p.ApprovalPolicy.GetPolicy()
		o.ApprovalRules = CloneAll(p.ApprovalPolicy.GetRules())
		f.s.Options = o
	case *sessionv1.SessionEvent_ApprovalDecided:
		if r := p.ApprovalDecided.GetAddedRule(); r != nil {
			// An added rule goes first: it is the most specific decision a
			// person made for this session.
			o := proto.CloneOf(f.s.Options)
			o.ApprovalRules = append([]*sessionv1.ApprovalRule{proto.CloneOf(r)}, o.ApprovalRules...)
			f.s.Options = o
		}
	case *sessionv1.SessionEvent_SandboxMode:
		o := proto.CloneOf(f.s.Options)
		o.Sandbox = proto.CloneOf(p.SandboxMode.GetSandbox())
		f.s.Options = o
	case *sessionv1.SessionEvent_SessionTitle:
		f.s.Title = p.SessionTitle.GetTitle()
	}
}

// FoldSettings folds a whole log (for logs not held in a [Log]).
func FoldSettings(h *sessionv1.SessionHeader, events []*sessionv1.SessionEvent) Settings {
	f := newSettingsFold(h)
	for _, ev := range events {
		f.apply(ev)
	}
	return f.s
}
