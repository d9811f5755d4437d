// The producer's self-check against the shared vectors (schemas/vectors/vectors.json): its
// validation agrees with idemq on every map there, its key builder reproduces the expected keys,
// and its encoder writes the seed event, a non-ASCII key and the largest amount as they should be.
package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"reflect"
	"strconv"
)

// checkVectors checks this producer against the shared vectors; returns the failures.
func checkVectors(path string) (passed, failed int) {
	var cases []struct {
		Name     string
		BodyJSON json.RawMessage `json:"body_json"`
		Expect   struct {
			BizKey string `json:"biz_key"`
			Error  string `json:"error"`
		} `json:"expect"`
	}
	raw, err := os.ReadFile(path)
	failOnError(err, "read vectors")
	failOnError(json.Unmarshal(raw, &cases), "parse vectors")
	check := func(ok bool, format string, args ...any) {
		if ok {
			passed++
			return
		}
		failed++
		fmt.Fprintf(os.Stderr, "FAIL "+format+"\n", args...)
	}
	seed := map[string]any{}
	for _, c := range cases {
		if c.BodyJSON == nil {
			continue
		}
		body := decode(c.BodyJSON) // our validation agrees with idemq on every map
		m, _ := body.(map[string]any)
		got := EnvelopeError(body)
		check(got == c.Expect.Error && (got != "" || m["biz_key"] == c.Expect.BizKey),
			"%s: validation says %q, idemq says %q", c.Name, got, c.Expect.Error+c.Expect.BizKey)
		if order, ok := m["order_id"].(string); ok && c.Expect.BizKey != "" {
			key := BuildBizKey(order, fmt.Sprint(m["event_type"]))
			check(key == c.Expect.BizKey, "%s: built key %q", c.Name, key)
		}
		if c.Name == "seed_payment_callback/json" {
			seed = m
		}
	}
	// Our own encoder: the seed event built as a PaymentEvent reads back as the vector, and a
	// non-ASCII key and the largest amount survive a round trip.
	amount, _ := strconv.ParseInt(fmt.Sprint(seed["amount"]), 10, 64)
	ours := NewEvent(fmt.Sprint(seed["order_id"]), fmt.Sprint(seed["event_type"]), amount)
	ours.MessageID, ours.OccurredAt = fmt.Sprint(seed["message_id"]), fmt.Sprint(seed["occurred_at"])
	body, _ := json.Marshal(ours)
	check(reflect.DeepEqual(decode(body), seed), "seed event encodes as %s", body)
	big, back := NewEvent("订单-café-😀", "PAY_SUCCESS", math.MaxInt64), PaymentEvent{}
	body, _ = json.Marshal(big)
	check(json.Unmarshal(body, &back) == nil && back == big && EnvelopeError(decode(body)) == "",
		"round trip of %s", body)
	return passed, failed
}
