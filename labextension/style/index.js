import './base.css';
import './main.css';
