/*
 * Prints, as JSON, what MirrorMaker 2's own classes make of MM2 properties files: the cluster
 * pairs it starts herders for, and per pair the connector configuration, whether the source
 * connector is enabled, its decision and remote name for each probe topic, its group filter's
 * decision for each probe group, and its clients' settings.
 *
 * Usage: Mm2ConfigOracle NAME... -- FILE...   (NAMEs are probed as topics and as groups)
 *
 * It lives in MirrorMaker 2's package because MirrorSourceConnector.shouldReplicateTopic and
 * the client-config methods are package-private: compile it with javac next to the
 * connect-mirror jars (see tests/test_mm2_conformance.py).
 */
package org.apache.kafka.connect.mirror;

import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.kafka.common.utils.Utils;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

public class Mm2ConfigOracle {
    public static void main(String[] args) throws Exception {
        List<String> all = Arrays.asList(args);
        int separator = all.indexOf("--");
        List<String> names = all.subList(0, separator);
        Map<String, Object> out = new TreeMap<>();
        for (String file : all.subList(separator + 1, all.size())) {
            try {
                out.put(file, describe(file, names));
            } catch (Exception e) {
                out.put(file, Map.of("error", e.toString()));
            }
        }
        System.out.println(new ObjectMapper().writeValueAsString(out));
    }

    static Map<String, Object> describe(String file, List<String> names) throws Exception {
        Map<String, String> props = Utils.propsToStringMap(Utils.loadProps(file));
        // Find plugins through ServiceLoader only: scanning the classpath per file is slow, and no
        // connector setting depends on it.
        props.putIfAbsent("plugin.discovery", "service_load");
        MirrorMakerConfig config = new MirrorMakerConfig(props);
        List<String> pairs = new ArrayList<>();
        Map<String, Object> flows = new TreeMap<>();
        for (SourceAndTarget pair : config.clusterPairs()) {
            pairs.add(pair.toString());
            Map<String, String> base = config.connectorBaseConfig(pair, MirrorSourceConnector.class);
            Map<String, Object> flow = new TreeMap<>();
            flow.put("config", new TreeMap<>(base));
            try {
                MirrorSourceConfig source = new MirrorSourceConfig(base);
                MirrorCheckpointConfig checkpoint = new MirrorCheckpointConfig(
                    config.connectorBaseConfig(pair, MirrorCheckpointConnector.class));
                ReplicationPolicy policy = source.replicationPolicy();
                MirrorSourceConnector connector = new MirrorSourceConnector(pair, policy,
                    source.topicFilter(), source.configPropertyFilter(), source.heartbeatsReplicationEnabled());
                GroupFilter groupFilter = checkpoint.groupFilter();
                Map<String, Object> topics = new TreeMap<>();
                Map<String, Object> groups = new TreeMap<>();
                for (String name : names) {
                    topics.put(name, connector.shouldReplicateTopic(name) ? policy.formatRemoteTopic(pair.source(), name) : null);
                    groups.put(name, groupFilter.shouldReplicateGroup(name));
                }
                flow.put("enabled", source.enabled());
                flow.put("topics", topics);
                flow.put("groups", groups);
                Map<String, Object> clients = new TreeMap<>();
                clients.put("source.consumer", source.sourceConsumerConfig("replication-consumer"));
                clients.put("source.producer", source.sourceProducerConfig("offset-syncs-source-producer"));
                clients.put("source.admin", source.sourceAdminConfig("replication-source-admin"));
                clients.put("target.producer", source.targetProducerConfig("offset-syncs-target-producer"));
                clients.put("target.admin", source.targetAdminConfig("replication-target-admin"));
                clients.put("target.consumer", checkpoint.targetConsumerConfig("checkpoint-target-consumer"));
                flow.put("clients", clients);
            } catch (Exception e) {
                flow.put("error", e.getMessage());
            }
            flows.put(pair.toString(), flow);
        }
        return Map.of("pairs", pairs, "flows", flows);
    }
}
