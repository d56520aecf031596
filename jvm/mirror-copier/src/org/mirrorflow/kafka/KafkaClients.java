package org.mirrorflow.kafka;

import java.time.Duration;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.common.TopicPartition;

/**
 * The Kafka clients of one JVM (driver or executor), kept between micro-batches as Spark's Kafka
 * connector keeps its own: one producer per settings (thread-safe, shared by all tasks), and one
 * consumer per source partition, so that the next batch of a partition carries on from the
 * records its consumer already fetched instead of seeking and fetching them again.
 */
final class KafkaClients {
  /** Idle consumers kept per JVM, as Spark's {@code spark.kafka.consumer.cache.capacity}. */
  static final int CONSUMER_CAPACITY = 64;

  private static final Map<Map<String, Object>, KafkaProducer<byte[], byte[]>> PRODUCERS =
      new ConcurrentHashMap<>();
  private static final ScheduledExecutorService CLOSER =
      Executors.newSingleThreadScheduledExecutor(
          r -> {
            Thread thread = new Thread(r, "mirrorflow-clients-closer");
            thread.setDaemon(true);
            return thread;
          });
  private static final LinkedHashMap<String, PartitionReader> IDLE_READERS =
      new LinkedHashMap<>(16, 0.75f, true);

  static {
    Runtime.getRuntime()
        .addShutdownHook(new Thread(KafkaClients::closeAll, "mirrorflow-clients-close"));
  }

  private KafkaClients() {}

  static KafkaProducer<byte[], byte[]> producer(Map<String, Object> config) {
    return PRODUCERS.computeIfAbsent(new TreeMap<>(config), KafkaProducer::new);
  }

  /**
   * Forgets the producer of these settings after it failed, so that the batch's retry starts with
   * a new one. It is closed a minute later: other tasks of the failed batch may still use it, and
   * each must fail with its own error, not with a closed producer.
   */
  static void discardProducer(Map<String, Object> config) {
    KafkaProducer<byte[], byte[]> producer = PRODUCERS.remove(new TreeMap<>(config));
    if (producer != null) {
      CLOSER.schedule(() -> producer.close(Duration.ofSeconds(5)), 60, TimeUnit.SECONDS);
    }
  }

  /** The idle reader of {@code tp} for these settings, or a new one. Give it back with {@link
   * #release}, or close it if it failed. */
  static PartitionReader borrow(Map<String, Object> config, TopicPartition tp) {
    String key = key(config, tp);
    synchronized (IDLE_READERS) {
      PartitionReader idle = IDLE_READERS.remove(key);
      if (idle != null) {
        return idle;
      }
    }
    return new PartitionReader(new KafkaConsumer<>(config), tp);
  }

  static void release(
      Map<String, Object> config, TopicPartition tp, PartitionReader consumer) {
    PartitionReader evicted = null;
    PartitionReader replaced;
    synchronized (IDLE_READERS) {
      replaced = IDLE_READERS.put(key(config, tp), consumer);
      if (IDLE_READERS.size() > CONSUMER_CAPACITY) {
        Iterator<PartitionReader> oldest = IDLE_READERS.values().iterator();
        evicted = oldest.next();
        oldest.remove();
      }
    }
    for (PartitionReader c : new PartitionReader[] {replaced, evicted}) {
      if (c != null && c != consumer) {
        c.close();
      }
    }
  }

  private static String key(Map<String, Object> config, TopicPartition tp) {
    return tp + "\0" + new TreeMap<>(config);
  }

  private static void closeAll() {
    for (KafkaProducer<byte[], byte[]> producer : PRODUCERS.values()) {
      producer.close(Duration.ofSeconds(30));
    }
    synchronized (IDLE_READERS) {
      for (PartitionReader consumer : IDLE_READERS.values()) {
        consumer.close();
      }
      IDLE_READERS.clear();
    }
  }
}
