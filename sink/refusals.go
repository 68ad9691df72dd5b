package sink

import "sync"

// An API that sluice does not control answers each request alone: it never
// says whether a 400 is about the record or about every request (a body
// template the API no longer accepts, a changed schema). refusals tells
// the two apart from the answers the sink has seen, so that a refusal of
// everything pauses the worker instead of dead-lettering the stream, while
// a bad record is still dead-lettered and its neighbours delivered:
//
//   - a write is *refused* when none of its requests was stored (2xx or a
//     duplicate) and at least one answered a dead-letter status; refused
//     writes in a row count up from 1, and any stored record resets them;
//   - a write is *suspect* when every request it sent answered the same
//     dead-letter status, and it carried two or more records or is not the
//     first refused write in a row;
//   - a suspect write fails as a whole (Write returns an error: the
//     pipeline pauses the sink and keeps the records) as many times as
//     there were refused writes in a row before it (at least once, at most
//     maxConfirmations); the pipeline probes a paused sink with that write
//     alone, and once its records have been refused so that often their
//     answers are taken as verdicts about them: they are dead-lettered.
//
// So a lone bad record among stored ones is dead-lettered at once; a
// batch of bad records, or a second bad record with nothing stored in
// between, after one probe; an API that refuses everything dead-letters a
// record or a write's records before the refusals are recognised, and
// then each further write only after 3, 7, 15, then 16 failed probes —
// each after the pipeline's pause, up to 5 s — so a stream waits for
// the API to be fixed instead of draining into the dead-letter topic.
type refusals struct {
	mu      sync.Mutex
	inRow   int                 // refused writes in a row
	suspect map[string]*suspect // by the records' batch key
}

// suspect is a write refused as a whole so far.
type suspect struct {
	seen int // identical answers so far
	need int // identical answers it takes to dead-letter its records
}

// maxConfirmations caps the probes a suspect write needs before its
// records are dead-lettered.
const maxConfirmations = 16

// maxSuspects bounds the suspect writes remembered; past it they are
// forgotten (a forgotten write starts its confirmations over).
const maxSuspects = 4096

// observe records one write's answers: stored tells whether any of its
// records was stored; refused whether any answered a dead-letter status;
// uniform whether every request it sent answered the same dead-letter
// status; records is how many records those requests carried; key
// identifies the records (their batch key). It returns how many more
// identical answers it takes to dead-letter the records when the write
// must fail as a whole, else 0.
func (r *refusals) observe(key string, records int, stored, refused, uniform bool) (left int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if stored {
		r.inRow = 0
	} else if refused {
		r.inRow++
	}
	if !uniform || stored || (records < 2 && r.inRow < 2) {
		delete(r.suspect, key)
		return 0
	}
	if r.suspect == nil || len(r.suspect) >= maxSuspects {
		r.suspect = map[string]*suspect{}
	}
	s := r.suspect[key]
	if s == nil {
		// One confirmation more than the refused writes in a row before
		// this one (at least one, at most maxConfirmations).
		s = &suspect{need: min(max(r.inRow-1, 1), maxConfirmations)}
		r.suspect[key] = s
	}
	if s.seen >= s.need {
		delete(r.suspect, key)
		return 0
	}
	s.seen++
	return s.need - s.seen + 1
}
