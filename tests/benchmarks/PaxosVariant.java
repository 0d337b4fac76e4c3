import javax.management.Attribute;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

/** Reads, or sets, a running Cassandra's Paxos variant over its local JMX port: java PaxosVariant.java PORT [v1|v2]. */
public class PaxosVariant {
    public static void main(String[] args) throws Exception {
        JMXServiceURL url = new JMXServiceURL("service:jmx:rmi:///jndi/rmi://127.0.0.1:" + args[0] + "/jmxrmi");
        try (JMXConnector connector = JMXConnectorFactory.connect(url)) {
            MBeanServerConnection server = connector.getMBeanServerConnection();
            ObjectName proxy = new ObjectName("org.apache.cassandra.db:type=StorageProxy");
            if (args.length > 1) {
                server.setAttribute(proxy, new Attribute("PaxosVariant", args[1]));
            }
            System.out.println(server.getAttribute(proxy, "PaxosVariant"));
        }
    }
}
