/*
 * A payment-callback producer for idemq, with the RabbitMQ Java client and Gson.
 *
 * Reads events from stdin, one per line: ORDER_ID EVENT_TYPE AMOUNT (amount in minor units), and
 * publishes each as an idemq envelope, persistent, with publisher confirms.
 *
 *   make && AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f \
 *     java -cp "out:$(make -s classpath)" Producer --routing-key payments [--exchange EX] < events.txt
 *   java -cp "out:$(make -s classpath)" Producer --check-vectors ../../../schemas/vectors/vectors.json
 *
 * AMQP_EXCHANGE and AMQP_ROUTING_KEY stand in for the options.
 */
import com.google.gson.FieldNamingPolicy;
import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonElement;
import com.google.gson.JsonParser;
import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;

public final class Producer {
    /** The envelope. Gson writes the fields snake_case (bizKey → biz_key): the contract's keys. */
    record PaymentEvent(String messageId, String bizKey, String orderId, String eventType,
                        long amount, String occurredAt) {}  // amount: minor units, a long

    static final Gson GSON = new GsonBuilder()
            .setFieldNamingPolicy(FieldNamingPolicy.LOWER_CASE_WITH_UNDERSCORES).create();

    /** The business key: built here, from business data only. Never from a timestamp, a random
     *  id or the message id: a resend of the same event must carry the same key. */
    static String buildBizKey(String orderId, String eventType) {
        return "order_id:" + orderId + ":" + eventType;
    }

    static PaymentEvent newEvent(String orderId, String eventType, long amount) {
        return new PaymentEvent(UUID.randomUUID().toString(), // fresh per message: tracing only
                buildBizKey(orderId, eventType), orderId, eventType, amount,
                Instant.now().truncatedTo(ChronoUnit.SECONDS).toString());
    }

    /** What idemq would dead-letter a body for (the names of schemas/vectors), or null. */
    static String envelopeError(JsonElement body) {
        if (!body.isJsonObject()) return "not_map";
        JsonElement key = body.getAsJsonObject().get("biz_key");
        if (key == null) return "biz_key_missing";
        if (!key.isJsonPrimitive() || !key.getAsJsonPrimitive().isString()) return "biz_key_type";
        String k = key.getAsString();
        if (k.isEmpty()) return "biz_key_empty";
        if (k.getBytes(StandardCharsets.UTF_8).length > 128) return "biz_key_too_long"; // bytes
        if (k.indexOf('\0') >= 0) return "biz_key_utf8";
        if (depth(body) > 32) return "too_deep"; // the top-level map is level 1
        return null;
    }

    static int depth(JsonElement v) {
        Iterable<JsonElement> children = v.isJsonObject() ? v.getAsJsonObject().asMap().values()
                : v.isJsonArray() ? v.getAsJsonArray() : null;
        if (children == null) return 0;
        int n = 0;
        for (JsonElement child : children) n = Math.max(n, depth(child));
        return n + 1;
    }

    static void publish(List<PaymentEvent> events, String url, String exchange, String routingKey)
            throws Exception {
        ConnectionFactory factory = new ConnectionFactory();
        factory.setUri(url);
        try (Connection connection = factory.newConnection();
             Channel channel = connection.createChannel()) {
            channel.confirmSelect();
            AtomicInteger returned = new AtomicInteger();
            channel.addReturnListener((code, text, ex, key, props, body) -> returned.incrementAndGet());
            for (PaymentEvent event : events) {
                String json = GSON.toJson(event);
                String error = envelopeError(JsonParser.parseString(json)); // check what is sent
                if (error != null)
                    throw new IllegalArgumentException("refusing " + event.bizKey() + ": " + error);
                AMQP.BasicProperties props = new AMQP.BasicProperties.Builder()
                        .contentType("application/json").deliveryMode(2 /* persistent */)
                        .messageId(event.messageId()).build();
                channel.basicPublish(exchange, routingKey, true /* mandatory */, props,
                        json.getBytes(StandardCharsets.UTF_8));
            }
            channel.waitForConfirmsOrDie(30_000); // throws on a nack or a timeout
            if (returned.get() > 0) // a basic.return comes before its message's confirm
                throw new IllegalStateException(returned.get() + " message(s) were unroutable");
        }
    }

    /** Checks this producer against the shared vectors; returns the number of failures. */
    static int checkVectors(String path) throws Exception {
        int[] counts = {0, 0}; // passed, failed
        java.util.function.BiConsumer<Boolean, String> check = (ok, what) -> {
            counts[ok ? 0 : 1]++;
            if (!ok) System.err.println("FAIL " + what);
        };
        JsonElement seed = null;
        for (JsonElement c : JsonParser.parseString(Files.readString(Path.of(path))).getAsJsonArray()) {
            var vector = c.getAsJsonObject();
            var expect = vector.getAsJsonObject("expect");
            JsonElement body = vector.get("body_json");
            if (body == null) continue;
            String want = expect.has("error") ? expect.get("error").getAsString() : null;
            String got = envelopeError(body); // our validation agrees with idemq on every map
            String name = vector.get("name").getAsString();
            check.accept(java.util.Objects.equals(got, want) && (got != null
                    || body.getAsJsonObject().get("biz_key").equals(expect.get("biz_key"))),
                    name + ": validation says " + got + ", idemq says " + expect);
            if (want == null && body.getAsJsonObject().has("order_id")) {
                Map<String, JsonElement> m = body.getAsJsonObject().asMap();
                String key = buildBizKey(m.get("order_id").getAsString(), m.get("event_type").getAsString());
                check.accept(key.equals(expect.get("biz_key").getAsString()), name + ": built key " + key);
            }
            if (name.equals("seed_payment_callback/json")) seed = body;
        }
        // Our own encoder: the seed event built as a PaymentEvent reads back as the vector, and a
        // non-ASCII key and the largest amount survive a round trip.
        Map<String, JsonElement> s = seed.getAsJsonObject().asMap();
        PaymentEvent ours = new PaymentEvent(s.get("message_id").getAsString(),
                buildBizKey(s.get("order_id").getAsString(), s.get("event_type").getAsString()),
                s.get("order_id").getAsString(), s.get("event_type").getAsString(),
                s.get("amount").getAsLong(), s.get("occurred_at").getAsString());
        String json = GSON.toJson(ours);
        check.accept(JsonParser.parseString(json).equals(seed), "seed event encodes as " + json);
        PaymentEvent big = newEvent("订单-café-😀", "PAY_SUCCESS", Long.MAX_VALUE);
        json = GSON.toJson(big);
        check.accept(GSON.fromJson(json, PaymentEvent.class).equals(big)
                && envelopeError(JsonParser.parseString(json)) == null, "round trip of " + json);
        System.out.printf("java check-vectors: %d passed, %d failed%n", counts[0], counts[1]);
        return counts[1];
    }

    public static void main(String[] args) throws Exception {
        String exchange = System.getenv().getOrDefault("AMQP_EXCHANGE", "");
        String routingKey = System.getenv("AMQP_ROUTING_KEY");
        if (args.length % 2 != 0) throw new IllegalArgumentException("every option takes a value");
        for (int i = 0; i < args.length; i += 2) {
            switch (args[i]) {
                case "--exchange" -> exchange = args[i + 1];
                case "--routing-key" -> routingKey = args[i + 1];
                case "--check-vectors" -> System.exit(checkVectors(args[i + 1]) == 0 ? 0 : 1);
                default -> throw new IllegalArgumentException("unknown option " + args[i]);
            }
        }
        if (routingKey == null) throw new IllegalArgumentException("--routing-key (or AMQP_ROUTING_KEY) is required");
        List<PaymentEvent> events = new ArrayList<>();
        var in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null; ) {
            if (line.isBlank()) continue;
            String[] f = line.trim().split("\\s+");
            if (f.length != 3) throw new IllegalArgumentException("want ORDER_ID EVENT_TYPE AMOUNT: " + line);
            events.add(newEvent(f[0], f[1], Long.parseLong(f[2])));
        }
        String url = System.getenv().getOrDefault("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f");
        publish(events, url, exchange, routingKey);
        System.out.println("java: " + events.size() + " messages confirmed");
    }
}
