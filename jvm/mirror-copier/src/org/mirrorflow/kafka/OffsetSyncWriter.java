package org.mirrorflow.kafka;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Offset syncs in MirrorMaker 2's format and by its {@code OffsetSyncWriter} rule.
 *
 * <p>{@link #acknowledged} is called from the acknowledgement of each copy, so a sync never
 * points at data that is not on the target. A sync is sent at once for the first copy of a
 * partition, after skipped upstream offsets, when the downstream offset moved {@code
 * offset.lag.max} past the last sync, and when the target went back; otherwise it is held back
 * and sent at the next flush (every {@code offset.flush.interval.ms}, and when closing). A failed
 * copy resets its partition: the next copy that lands is synced at once, as after a restart of a
 * MirrorMaker 2 task.
 *
 * <p>One writer per offset-syncs topic and producer settings lives in each JVM (driver or
 * executor) and serves every task there; a shutdown hook writes what it holds back.
 */
final class OffsetSyncWriter implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(OffsetSyncWriter.class);
  private static final Map<Map<String, Object>, OffsetSyncWriter> WRITERS =
      new ConcurrentHashMap<>();

  private final String topic;
  private final long maxOffsetLag;
  private final KafkaProducer<byte[], byte[]> producer;
  private final Map<TopicPartition, Partition> partitions = new ConcurrentHashMap<>();
  private final ScheduledExecutorService flusher;
  private final AtomicBoolean closed = new AtomicBoolean();
  private final AtomicLong sent = new AtomicLong();
  private final AtomicLong failed = new AtomicLong();

  /** The JVM's writer for these settings, created (and its topic checked) on first use. */
  static OffsetSyncWriter shared(
      String topic, long maxOffsetLag, long intervalMs, Map<String, Object> producerConfig) {
    Map<String, Object> key = new java.util.TreeMap<>(producerConfig);
    key.put("\0topic", topic);
    key.put("\0lag", maxOffsetLag);
    key.put("\0interval", intervalMs);
    return WRITERS.computeIfAbsent(
        key, k -> new OffsetSyncWriter(topic, maxOffsetLag, intervalMs, producerConfig));
  }

  private OffsetSyncWriter(
      String topic, long maxOffsetLag, long intervalMs, Map<String, Object> producerConfig) {
    this.topic = topic;
    this.maxOffsetLag = maxOffsetLag;
    this.producer = new KafkaProducer<>(producerConfig);
    // Fails here, before any copy, when the offset-syncs topic cannot be reached or written.
    producer.partitionsFor(topic);
    flusher =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread thread = new Thread(r, "mirrorflow-offset-syncs");
              thread.setDaemon(true);
              return thread;
            });
    flusher.scheduleWithFixedDelay(
        this::flushHeldBack, intervalMs, intervalMs, TimeUnit.MILLISECONDS);
    Runtime.getRuntime().addShutdownHook(new Thread(this::close, "mirrorflow-offset-syncs-close"));
  }

  /** The copy of {@code source}@{@code upstream} landed at {@code downstream}. */
  void acknowledged(TopicPartition source, long upstream, long downstream) {
    partitions.computeIfAbsent(source, Partition::new).acknowledged(upstream, downstream);
  }

  /** A copy of {@code source} failed: its next copy that lands is synced at once. */
  void failed(TopicPartition source) {
    Partition partition = partitions.get(source);
    if (partition != null) {
      partition.reset();
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
    if (!closed.compareAndSet(false, true)) {
      return;
    }
    flusher.shutdownNow();
    flushHeldBack();
    producer.close(Duration.ofSeconds(30));
    LOG.info("offset syncs to {}: {} sent, {} failed", topic, sent.get(), failed.get());
  }

  private void send(TopicPartition source, long upstream, long downstream) {
    byte[] name = source.topic().getBytes(StandardCharsets.UTF_8);
    ByteBuffer key = ByteBuffer.allocate(2 + name.length + 4);
    key.putShort((short) name.length).put(name).putInt(source.partition());
    ByteBuffer value = ByteBuffer.allocate(16).putLong(upstream).putLong(downstream);
    try {
      producer.send(
          new ProducerRecord<>(topic, 0, key.array(), value.array()),
          (meta, error) -> {
            if (error == null) {
              sent.incrementAndGet();
            } else if (failed.getAndIncrement() == 0) {
              LOG.error("writing offset syncs to {} failed: {}", topic, error.toString());
            }
          });
    } catch (IllegalStateException closedAlready) {
      // the JVM is shutting down: the copy stays, only its sync is not written
      failed.incrementAndGet();
    }
  }

  /** MirrorMaker 2's sync state of one source partition. */
  private final class Partition {
    private final TopicPartition source;
    private long previousUpstream = -1;
    private long previousDownstream = -1;
    private long lastSyncDownstream = -1;
    private long heldUpstream = -1;
    private long heldDownstream = -1;

    Partition(TopicPartition source) {
      this.source = source;
    }

    synchronized void acknowledged(long upstream, long downstream) {
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

    synchronized void reset() {
      previousUpstream = previousDownstream = lastSyncDownstream = -1;
      heldUpstream = heldDownstream = -1;
    }

    synchronized void sendHeldBack() {
      if (heldUpstream >= 0) {
        send(source, heldUpstream, heldDownstream);
        heldUpstream = heldDownstream = -1;
      }
    }
  }
}
