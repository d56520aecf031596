package org.mirrorflow.kafka;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerInterceptor;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The JVM half of mirrorflow's at-least-once copy, loaded into the producer of Spark's Kafka sink.
 *
 * <p>Spark's Kafka sink cannot set a record's timestamp and does not report where a record
 * landed. The mirror job therefore adds one header, {@code mirrorflow.copy} =
 * {@code "<upstream offset>,<timestamp ms>,<source topic>"}, to every copy. This interceptor
 *
 * <ul>
 *   <li>removes that header and gives the record the source record's timestamp ({@link #onSend});
 *   <li>pairs each acknowledged copy with its upstream offset (acknowledgements of one partition
 *       arrive in send order, so a queue per partition matches them) and applies MirrorMaker 2's
 *       {@code OffsetSyncWriter} rule: a sync is sent at once for the first copy of a partition,
 *       after skipped upstream offsets, when the downstream offset moved {@code offset.lag.max}
 *       past the last sync, and when the target went back; otherwise it is held back and sent
 *       at the next flush ({@code mirrorflow.offset.syncs.interval.ms}, and when closing).
 * </ul>
 *
 * <p>A sync is only ever sent from the acknowledgement of its copy, so it never points at data
 * that is not on the target. A failed send resets its partition's state: the next copy that
 * lands is synced at once.
 */
public final class MirrorCopyInterceptor implements ProducerInterceptor<byte[], byte[]> {
  public static final String HEADER = "mirrorflow.copy";
  static final String SYNCS_TOPIC = "mirrorflow.offset.syncs.topic";
  static final String MAX_OFFSET_LAG = "mirrorflow.offset.lag.max";
  static final String SYNCS_INTERVAL = "mirrorflow.offset.syncs.interval.ms";
  static final String SYNCS_PRODUCER = "mirrorflow.offset.syncs.producer.";

  private static final Logger LOG = LoggerFactory.getLogger(MirrorCopyInterceptor.class);

  private final Map<TopicPartition, Partition> partitions = new ConcurrentHashMap<>();
  private final AtomicBoolean closed = new AtomicBoolean();
  private final AtomicLong syncsSent = new AtomicLong();
  private final AtomicLong syncFailures = new AtomicLong();
  private KafkaProducer<byte[], byte[]> syncProducer;
  private String syncsTopic;
  private long maxOffsetLag = 100;
  private ScheduledExecutorService flusher;
  private Thread shutdownHook;

  @Override
  public void configure(Map<String, ?> configs) {
    Object topic = configs.get(SYNCS_TOPIC);
    if (topic == null || topic.toString().isEmpty()) {
      return; // timestamps only
    }
    syncsTopic = topic.toString();
    maxOffsetLag = longSetting(configs, MAX_OFFSET_LAG, 100);
    long interval = longSetting(configs, SYNCS_INTERVAL, 5000);
    Map<String, Object> producerConfig = new HashMap<>();
    for (Map.Entry<String, ?> entry : configs.entrySet()) {
      if (entry.getKey().startsWith(SYNCS_PRODUCER)) {
        producerConfig.put(entry.getKey().substring(SYNCS_PRODUCER.length()), entry.getValue());
      }
    }
    producerConfig.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    producerConfig.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    producerConfig.put(ProducerConfig.ACKS_CONFIG, "all");
    producerConfig.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
    producerConfig.remove(ProducerConfig.INTERCEPTOR_CLASSES_CONFIG);
    syncProducer = new KafkaProducer<>(producerConfig);
    // Fails here, at start-up, when the offset-syncs topic cannot be written or reached.
    syncProducer.partitionsFor(syncsTopic);
    flusher =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread thread = new Thread(r, "mirrorflow-offset-syncs");
              thread.setDaemon(true);
              return thread;
            });
    flusher.scheduleWithFixedDelay(this::flushHeldBack, interval, interval, TimeUnit.MILLISECONDS);
    shutdownHook = new Thread(this::close, "mirrorflow-offset-syncs-close");
    Runtime.getRuntime().addShutdownHook(shutdownHook);
  }

  @Override
  public ProducerRecord<byte[], byte[]> onSend(ProducerRecord<byte[], byte[]> record) {
    Headers headers = record.headers();
    Header copy = headers.lastHeader(HEADER);
    if (copy == null || copy.value() == null) {
      return record;
    }
    headers.remove(HEADER);
    byte[] value = copy.value();
    int first = indexOf(value, 0);
    int second = indexOf(value, first + 1);
    long upstream = parseLong(value, 0, first);
    long timestamp = parseLong(value, first + 1, second);
    if (syncProducer != null && record.partition() != null) {
      TopicPartition target = new TopicPartition(record.topic(), record.partition());
      Partition partition = partitions.get(target);
      if (partition == null) {
        String source =
            new String(value, second + 1, value.length - second - 1, StandardCharsets.UTF_8);
        partition =
            partitions.computeIfAbsent(
                target, tp -> new Partition(new TopicPartition(source, tp.partition())));
      }
      partition.sent(upstream);
    }
    return new ProducerRecord<>(
        record.topic(),
        record.partition(),
        timestamp >= 0 ? timestamp : null,
        record.key(),
        record.value(),
        headers);
  }

  @Override
  public void onAcknowledgement(RecordMetadata metadata, Exception exception) {
    if (syncProducer == null || metadata == null) {
      return;
    }
    Partition partition =
        partitions.get(new TopicPartition(metadata.topic(), metadata.partition()));
    if (partition != null) {
      partition.acknowledged(exception == null && metadata.hasOffset() ? metadata.offset() : -1);
    }
  }

  /** Sends the syncs held back since the last flush (MirrorMaker 2 does it at commit time). */
  void flushHeldBack() {
    for (Partition partition : partitions.values()) {
      partition.sendHeldBack();
    }
  }

  @Override
  public void close() {
    if (syncProducer == null || !closed.compareAndSet(false, true)) {
      return;
    }
    flusher.shutdownNow();
    flushHeldBack();
    syncProducer.close(Duration.ofSeconds(30));
    try {
      Runtime.getRuntime().removeShutdownHook(shutdownHook);
    } catch (IllegalStateException shuttingDown) {
      // close() runs from the hook itself
    }
    LOG.info(
        "offset syncs to {}: {} sent, {} failed", syncsTopic, syncsSent.get(), syncFailures.get());
  }

  private void send(TopicPartition source, long upstream, long downstream) {
    byte[] topic = source.topic().getBytes(StandardCharsets.UTF_8);
    ByteBuffer key = ByteBuffer.allocate(2 + topic.length + 4);
    key.putShort((short) topic.length).put(topic).putInt(source.partition());
    ByteBuffer value = ByteBuffer.allocate(16).putLong(upstream).putLong(downstream);
    try {
      syncProducer.send(
          new ProducerRecord<>(syncsTopic, 0, key.array(), value.array()),
          (meta, error) -> {
            if (error == null) {
              syncsSent.incrementAndGet();
            } else if (syncFailures.getAndIncrement() == 0) {
              LOG.error("writing offset syncs to {} failed: {}", syncsTopic, error.toString());
            }
          });
    } catch (IllegalStateException closedAlready) {
      // the JVM is shutting down: the copy stays, only its sync is not written
      syncFailures.incrementAndGet();
    }
  }

  /** One target partition: the upstream offsets in flight and MirrorMaker 2's sync state. */
  private final class Partition {
    private final TopicPartition source;
    private long[] inFlight = new long[1024];
    private int head;
    private int size;
    private long previousUpstream = -1;
    private long previousDownstream = -1;
    private long lastSyncDownstream = -1;
    private long heldUpstream = -1;
    private long heldDownstream = -1;

    Partition(TopicPartition source) {
      this.source = source;
    }

    synchronized void sent(long upstream) {
      if (size == inFlight.length) {
        long[] grown = new long[inFlight.length * 2];
        for (int i = 0; i < size; i++) {
          grown[i] = inFlight[(head + i) % inFlight.length];
        }
        inFlight = grown;
        head = 0;
      }
      inFlight[(head + size) % inFlight.length] = upstream;
      size++;
    }

    /** The copy of the oldest record in flight landed at {@code downstream} (-1: it failed). */
    synchronized void acknowledged(long downstream) {
      if (size == 0) {
        return;
      }
      long upstream = inFlight[head];
      head = (head + 1) % inFlight.length;
      size--;
      if (downstream < 0) {
        // A fault: start afresh, as a restarted MirrorMaker 2 task does.
        previousUpstream = previousDownstream = lastSyncDownstream = -1;
        heldUpstream = heldDownstream = -1;
        return;
      }
      boolean noSyncYet = lastSyncDownstream == -1;
      boolean tooStale = downstream - (lastSyncDownstream + 1) >= maxOffsetLag;
      boolean skippedUpstream = upstream - previousUpstream != 1;
      boolean truncatedDownstream = downstream < previousDownstream;
      previousUpstream = upstream;
      previousDownstream = downstream;
      if (noSyncYet || tooStale || skippedUpstream || truncatedDownstream) {
        lastSyncDownstream = downstream;
        heldUpstream = heldDownstream = -1;
        send(source, upstream, downstream);
      } else {
        heldUpstream = upstream;
        heldDownstream = downstream;
      }
    }

    synchronized void sendHeldBack() {
      if (heldUpstream >= 0) {
        send(source, heldUpstream, heldDownstream);
        heldUpstream = heldDownstream = -1;
      }
    }
  }

  private static long longSetting(Map<String, ?> configs, String name, long otherwise) {
    Object value = configs.get(name);
    return value == null ? otherwise : Long.parseLong(value.toString().trim());
  }

  private static int indexOf(byte[] bytes, int from) {
    for (int i = from; i < bytes.length; i++) {
      if (bytes[i] == ',') {
        return i;
      }
    }
    throw new IllegalArgumentException("malformed " + HEADER + " header");
  }

  private static long parseLong(byte[] bytes, int from, int to) {
    boolean negative = bytes[from] == '-';
    long result = 0;
    for (int i = negative ? from + 1 : from; i < to; i++) {
      result = result * 10 + (bytes[i] - '0');
    }
    return negative ? -result : result;
  }
}
