// A payment-callback producer for idemq, with amqp091-go.
//
// Reads events from stdin, one per line: ORDER_ID EVENT_TYPE AMOUNT (amount in minor units), and
// publishes each as an idemq envelope, persistent, with publisher confirms.
//
//	AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f ./producer -routing-key payments [-exchange EX] < events.txt
//	./producer -check-vectors ../../../schemas/vectors/vectors.json
//
// AMQP_EXCHANGE and AMQP_ROUTING_KEY stand in for the flags. Build on Debian 12 (GOPATH mode,
// golang-github-rabbitmq-amqp091-go-dev): GO111MODULE=off GOPATH=/usr/share/gocode go build -o producer .
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// PaymentEvent is the envelope. The json tags are the contract: without them encoding/json
// sends "BizKey", and idemq dead-letters the message as biz_key_missing.
type PaymentEvent struct {
	MessageID  string `json:"message_id"` // fresh per message: tracing only, never the key
	BizKey     string `json:"biz_key"`
	OrderID    string `json:"order_id"`
	EventType  string `json:"event_type"`
	Amount     int64  `json:"amount"` // minor units; int64 is exactly what idemq reads
	OccurredAt string `json:"occurred_at"`
}

// BuildBizKey builds the business key here, in the producer, from business data only: never
// from a timestamp, a random id or the message ID, so a resend carries the same key.
func BuildBizKey(orderID, eventType string) string {
	return "order_id:" + orderID + ":" + eventType
}

func NewEvent(orderID, eventType string, amount int64) PaymentEvent {
	id := make([]byte, 16) // a random UUID (version 4)
	_, err := rand.Read(id)
	failOnError(err, "random message ID")
	id[6], id[8] = id[6]&0x0f|0x40, id[8]&0x3f|0x80
	return PaymentEvent{
		MessageID: fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:]),
		BizKey:    BuildBizKey(orderID, eventType), OrderID: orderID, EventType: eventType,
		Amount: amount, OccurredAt: time.Now().UTC().Format(time.RFC3339)}
}

// EnvelopeError says what idemq would dead-letter a decoded body for (the names of
// schemas/vectors), or "" when it would accept it.
func EnvelopeError(v any) string {
	m, isMap := v.(map[string]any)
	key, isString := m["biz_key"].(string)
	_, present := m["biz_key"]
	switch {
	case !isMap:
		return "not_map"
	case !present:
		return "biz_key_missing"
	case !isString:
		return "biz_key_type"
	case key == "":
		return "biz_key_empty"
	case len(key) > 128: // bytes of UTF-8, not characters
		return "biz_key_too_long"
	case strings.ContainsRune(key, 0):
		return "biz_key_utf8"
	case depth(m) > 32: // nested maps and arrays; the top-level map is level 1
		return "too_deep"
	}
	return ""
}

func depth(v any) int {
	var children []any
	switch c := v.(type) {
	case map[string]any:
		for _, x := range c {
			children = append(children, x)
		}
	case []any:
		children = c
	default:
		return 0
	}
	n := 0
	for _, x := range children {
		if d := depth(x); d > n {
			n = d
		}
	}
	return n + 1
}

func publish(events []PaymentEvent, url, exchange, routingKey string) {
	conn, err := amqp.Dial(url)
	failOnError(err, "connect")
	defer conn.Close()
	ch, err := conn.Channel()
	failOnError(err, "open a channel")
	failOnError(ch.Confirm(false), "confirm mode")
	// Confirms through NotifyPublish: Debian's amqp091-go 1.5.0 can lose a fast confirm with
	// PublishWithDeferredConfirm. Buffers as large as the batch: the library must never block.
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(events)))
	returns := ch.NotifyReturn(make(chan amqp.Return, len(events)))
	for _, ev := range events {
		body, err := json.Marshal(ev)
		failOnError(err, "encode")
		if e := EnvelopeError(decode(body)); e != "" { // check what is actually sent
			log.Fatalf("go: refusing to publish %q: %s", ev.BizKey, e)
		}
		failOnError(ch.PublishWithContext(context.Background(), exchange, routingKey,
			true /* mandatory */, false, amqp.Publishing{ContentType: "application/json",
				DeliveryMode: amqp.Persistent, MessageId: ev.MessageID, Body: body}), "publish")
	}
	for range events {
		if c, ok := <-confirms; !ok || !c.Ack {
			log.Fatalf("go: the broker did not confirm message %d", c.DeliveryTag)
		}
	}
	if len(returns) > 0 { // a basic.return comes before its message's confirm
		r := <-returns
		log.Fatalf("go: unroutable (%s): %s", r.ReplyText, r.MessageId)
	}
}

func decode(body []byte) (v any) {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber() // numbers as written, not float64
	if d.Decode(&v) != nil {
		return nil
	}
	return v
}

func failOnError(err error, what string) {
	if err != nil {
		log.Fatalf("go: %s: %v", what, err)
	}
}

func main() {
	exchange := flag.String("exchange", os.Getenv("AMQP_EXCHANGE"), `exchange ("": the default one)`)
	routingKey := flag.String("routing-key", os.Getenv("AMQP_ROUTING_KEY"), "routing key (the queue, on the default exchange)")
	vectors := flag.String("check-vectors", "", "check this producer against schemas/vectors/vectors.json")
	flag.Parse()
	if *vectors != "" {
		passed, failed := checkVectors(*vectors)
		fmt.Printf("go check-vectors: %d passed, %d failed\n", passed, failed)
		if failed > 0 {
			os.Exit(1)
		}
		return
	}
	if *routingKey == "" {
		log.Fatal("go: -routing-key (or AMQP_ROUTING_KEY) is required")
	}
	var events []PaymentEvent
	for lines := bufio.NewScanner(os.Stdin); lines.Scan(); {
		var order, event string
		var amount int64
		if n, _ := fmt.Sscan(lines.Text(), &order, &event, &amount); n == 3 {
			events = append(events, NewEvent(order, event, amount))
		} else if strings.TrimSpace(lines.Text()) != "" {
			log.Fatalf("go: bad line %q: want ORDER_ID EVENT_TYPE AMOUNT", lines.Text())
		}
	}
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/%2f"
	}
	publish(events, url, *exchange, *routingKey)
	fmt.Printf("go: %d messages confirmed\n", len(events))
}
